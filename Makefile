# Everyday commands; CI runs .ci/run (the README's test command, then `make lint`).
.PHONY: lint format test-unit test e2e

lint:  ## ruff (rules and format), mypy (strict on hashing/ and store/), the layer contracts
	ruff check .
	ruff format --check .
	mypy
	lint-imports

format:  ## fix what ruff can fix
	ruff check --fix .
	ruff format .

test-unit:  ## pure tests: no Redis, no model weights, under a minute
	pytest tests/unit

test:  ## everything but the default model's end-to-end tests (real Redis, tiny model, real HTTP)
	pytest -m "not e2e"

e2e:  ## end-to-end tests on the default model (fetched once into ~/.cache/kvproxy)
	pytest -m e2e
