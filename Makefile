# Thin aliases for the scripts; the scripts are the real entry points.
.PHONY: help test lab images artifacts lint unit
.DEFAULT_GOAL := help

help:        ## list the targets (the default)
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-10s %s\n", $$1, $$2}'

test:        ## install everything needed, then run the unit and integration tests (the CI command)
	scripts/test

lab:         ## bring up the multi-site lab and show data flowing
	scripts/lab up

images:      ## build (or confirm up to date) every project image
	scripts/engine && scripts/base-image && scripts/artifacts fetch && scripts/images build

artifacts:   ## fetch and verify the pinned jars and wheels into the cache
	scripts/artifacts fetch

unit:        ## fast tests that need no Docker
	bash -c 'source scripts/_venv.sh && python -m pytest -q tests/unit'

lint:        ## ruff over the Python tree (needs .venv; yamllint and ansible-lint run in tests/unit/test_lint.py)
	.venv/bin/ruff check .
