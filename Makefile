# The two fresh-machine commands: `make demo` and `make test`. Both set everything up first.
.PHONY: env env-numpy2 demo test bench lint generate

env:
	./scripts/bootstrap-env.sh

# A worker environment with NumPy 2 (on Python 3.13 when there is one) beside the default one.
env-numpy2: env
	./scripts/bootstrap-env.sh numpy2

demo: env
	.venv/bin/python examples/quickstart/demo.py

# The demo and the data-path tests also run in the NumPy 2 worker environment: the stub's Python is
# kubetriton's own, whatever the worker's numpy and Python are.
test: env env-numpy2
	.venv/bin/python -m ruff check .
	.venv/bin/python examples/quickstart/demo.py
	.venv-numpy2/bin/python examples/quickstart/demo.py
	.venv-numpy2/bin/python -m pytest tests/test_data_path.py
	.venv/bin/python -m pytest

bench: env
	.venv/bin/python bench/data_path.py
	.venv/bin/python bench/zmq_floor.py

lint: env
	.venv/bin/python -m ruff check .
	.venv/bin/python -m ruff format --check .
