"""The lab (scripts/lab): containers as hosts deployed with site.yml, its status, and the fault and abuse suites."""
