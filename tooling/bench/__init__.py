"""The benchmarks (scripts/bench NAME): each prints its figures beside a baseline run side by side."""
