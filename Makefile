# The two fresh-machine commands: `make demo` and `make test`. Both set everything up first.
.PHONY: env demo test bench lint generate

env:
	./scripts/bootstrap-env.sh

demo: env
	.venv/bin/python examples/quickstart/demo.py

test: env
	.venv/bin/python -m ruff check .
	.venv/bin/python -m pytest

bench: env
	.venv/bin/python bench/data_path.py
	.venv/bin/python bench/zmq_floor.py

lint: env
	.venv/bin/python -m ruff check .
	.venv/bin/python -m ruff format --check .
