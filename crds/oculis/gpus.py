"""GPU facts shared by the schema, the operator's capacity math and the e2e node pools.

Data only. Product names are what GPU Feature Discovery writes into the `nvidia.com/gpu.product`
label; memory is per GPU in MiB, as GFD's `nvidia.com/gpu.memory` label reports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GPUProduct:
    key: str  # Oculis' short name, as used in `spec.gpu.product`
    gfd_product: str  # value of the `nvidia.com/gpu.product` node label
    memory_mib: int  # value of the `nvidia.com/gpu.memory` node label
    family: str  # value of the `nvidia.com/gpu.family` node label
    compute_major: int
    compute_minor: int
    # Datasheet peaks (dense tensor-core figures; sparse is 2x), for the engine simulator's step-time
    # model: HBM/GDDR bandwidth in GB/s and BF16 / FP8 TFLOPS (0 = no FP8 tensor cores).
    bandwidth_gb_s: float = 0.0
    bf16_tflops: float = 0.0
    fp8_tflops: float = 0.0

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024


# Memory figures: NVIDIA data sheets (A100 40/80 GB, H100 SXM5 80 GB HBM3, H200 141 GB HBM3e,
# L40S 48 GB GDDR6); MiB as nvidia-smi reports usable framebuffer on those parts. Bandwidth and TFLOPS:
# the same data sheets as quoted by BLIS `hardware_config.json` and LLM-Viewer `hardware_params.py`
# (../shared/notes/simulator.md section 4).
GPU_PRODUCTS: dict[str, GPUProduct] = {
    p.key: p
    for p in (
        GPUProduct("A100-40GB", "NVIDIA-A100-SXM4-40GB", 40960, "ampere", 8, 0, 1555, 312, 0),
        GPUProduct("A100-80GB", "NVIDIA-A100-SXM4-80GB", 81920, "ampere", 8, 0, 2039, 312, 0),
        GPUProduct("H100-80GB", "NVIDIA-H100-80GB-HBM3", 81559, "hopper", 9, 0, 3350, 989, 1979),
        GPUProduct("H200-141GB", "NVIDIA-H200", 143771, "hopper", 9, 0, 4800, 989, 1979),
        GPUProduct("L40S-48GB", "NVIDIA-L40S", 46068, "ada-lovelace", 8, 9, 864, 362, 733),
    )
}

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# The taint GPU node pools usually carry (GKE, EKS and the NVIDIA GPU operator docs use this key),
# so that only pods that ask for GPUs land there.
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "present"
GPU_TAINT_EFFECT = "NoSchedule"


def lookup(name: str) -> GPUProduct:
    """Find a product by Oculis short name or by its GFD label value; raise KeyError naming the choices."""
    if name in GPU_PRODUCTS:
        return GPU_PRODUCTS[name]
    for product in GPU_PRODUCTS.values():
        if product.gfd_product == name:
            return product
    choices = ", ".join(sorted(GPU_PRODUCTS))
    raise KeyError(f"unknown GPU product {name!r}; use one of {choices} (or its nvidia.com/gpu.product value)")
