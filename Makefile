# Thin aliases for the scripts; the scripts are the real entry points.
.PHONY: test lab images artifacts lint unit

test:        ## install everything needed and run all tests (the CI command)
	scripts/test

lab:         ## bring up the multi-site lab and show data flowing
	scripts/lab up

images:      ## build (or confirm up to date) every project image
	scripts/engine && scripts/base-image && scripts/artifacts fetch && scripts/images build

artifacts:   ## fetch and verify the pinned jars and wheels into the cache
	scripts/artifacts fetch

unit:        ## fast tests that need no Docker
	bash -c 'source scripts/_venv.sh && python -m pytest -q tests/unit'

lint:
	.venv/bin/ruff check .
