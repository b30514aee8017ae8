"""What every tier and every service shares: data contracts and names, settings,
dead-letter records, the site rule, gap-free offset commits, backoff, logging and health.

Standard library only, so the Spark image (which installs this package without
the services' dependencies) can import it. Nothing here imports another package
of `services`.
"""
