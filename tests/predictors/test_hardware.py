"""The GPU catalog: sources, aliases (incl. Kubernetes node labels), and sanity of the figures."""

from __future__ import annotations

import pytest

from predictors.errors import SpecError
from predictors.hardware import GpuSpec, gpu_catalog, lookup_gpu

REQUIRED = ("L40S", "A100-40GB", "A100-80GB", "H100-80GB", "H100-PCIe", "H100-96GB", "H200", "B200", "A10G",
            "L4", "T4", "V100-16GB", "V100-32GB", "RTX-3090", "RTX-4090", "RTX-A6000")

# Sparse (2:4) tensor TFLOP/s from shared/reference/gpus.csv (bf16_sparse_TFLOPS, fp8_sparse_TFLOPS).
SPARSE_TFLOPS: dict[str, tuple[float, float | None]] = {
    "L40S": (733, 1466), "A100-40GB": (624, None), "A100-80GB": (624, None), "H100-80GB": (1979, 3958),
    "H100-PCIe": (1513, 3026), "H200": (1979, 3958), "B200": (4500, 9000),
}
# rel=0.02: the L40S datasheet itself lists BF16 as 362.05 dense but 733 sparse.
MIB = 2**20


def test_required_gpus_present() -> None:
    assert set(REQUIRED) <= set(gpu_catalog())


@pytest.mark.parametrize("gpu", list(gpu_catalog().values()), ids=lambda g: g.name)
def test_every_gpu_is_sourced_and_consistent(gpu: GpuSpec) -> None:
    assert gpu.sources and all(s.strip() for s in gpu.sources)
    assert gpu.memory_bytes % MIB == 0, "memory_bytes is an nvidia-smi MiB total x 2^20"
    assert gpu.fp32_flops < gpu.fp16_dense_flops
    if gpu.bf16_dense_flops is not None:
        assert gpu.bf16_dense_flops == gpu.fp16_dense_flops
    if gpu.fp8_dense_flops is not None:
        assert gpu.fp8_dense_flops == pytest.approx(2 * gpu.fp16_dense_flops, rel=0.02)
    if gpu.tf32_dense_flops is not None:
        assert gpu.tf32_dense_flops <= gpu.fp16_dense_flops
    assert gpu.pcie_bytes_per_second in (16e9, 32e9, 64e9)


@pytest.mark.parametrize("name", sorted(SPARSE_TFLOPS))
def test_dense_is_half_of_sparse(name: str) -> None:
    gpu = gpu_catalog()[name]
    bf16_sparse, fp8_sparse = SPARSE_TFLOPS[name]
    assert gpu.bf16_dense_flops is not None and gpu.bf16_dense_flops < bf16_sparse * 1e12
    assert gpu.bf16_dense_flops == pytest.approx(bf16_sparse * 1e12 / 2, rel=0.02)
    if fp8_sparse is None:
        assert gpu.fp8_dense_flops is None
    else:
        assert gpu.fp8_dense_flops == pytest.approx(fp8_sparse * 1e12 / 2, rel=0.02)


@pytest.mark.parametrize(("name", "mib"), [
    ("H100-80GB", 81559), ("H100-PCIe", 81559), ("A100-80GB", 81920), ("A100-40GB", 40960), ("H200", 143771),
    ("B200", 183359), ("L40S", 46068),
])
def test_memory_matches_reference_nvidia_smi(name: str, mib: int) -> None:
    assert gpu_catalog()[name].memory_bytes == mib * MIB


@pytest.mark.parametrize(("label", "name"), [
    ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
    ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA-A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA-A100-PCIE-80GB", "A100-80GB-PCIe"),
    ("Tesla-T4", "T4"),
    ("Tesla-V100-SXM2-16GB", "V100-16GB"),
    ("NVIDIA-L4", "L4"),
    ("NVIDIA-A10G", "A10G"),
    ("NVIDIA-L40S", "L40S"),
    ("NVIDIA-H200", "H200"),
    ("NVIDIA-B200", "B200"),
    ("NVIDIA-GeForce-RTX-4090", "RTX-4090"),
    ("NVIDIA-RTX-A6000", "RTX-A6000"),
    ("h100", "H100-80GB"),
    ("a100-80gb", "A100-80GB"),
    ("NVIDIA H100 PCIe", "H100-PCIe"),
    # the GPU Feature Discovery labels (nvidia.com/gpu.product) of the cards added 2026-11-26
    ("NVIDIA-A10", "A10"),
    ("NVIDIA-A40", "A40"),
    ("NVIDIA-L40", "L40"),
    ("NVIDIA-RTX-A5000", "RTX-A5000"),
    ("NVIDIA-A800-SXM4-80GB", "A800-80GB"),
    ("NVIDIA-H800", "H800"),
])
def test_aliases_and_node_labels_resolve(label: str, name: str) -> None:
    assert lookup_gpu(label).name == name


def test_unknown_gpu_suggests_close_names() -> None:
    with pytest.raises(SpecError) as err:
        lookup_gpu("H100-94GB", path="spec.gpu")
    text = str(err.value)
    assert "unknown GPU 'H100-94GB'" in text and "did you mean" in text and "H100-80GB" in text
    assert err.value.problems[0].path == "spec.gpu"


def test_dense_flops_by_precision() -> None:
    h100 = gpu_catalog()["H100-80GB"]
    assert h100.dense_flops("bf16-mixed") == 989e12
    # fp32 runs on the CUDA cores (PyTorch's allow_tf32 matmul default is False), not at the TF32 tensor peak
    assert h100.dense_flops("32-true") == h100.fp32_flops == 67e12 and h100.tf32_dense_flops == 494e12
    t4 = gpu_catalog()["T4"]
    assert t4.dense_flops("bf16-mixed") == t4.fp16_dense_flops  # no BF16 on Turing: falls back to FP16
