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
    # What torch.cuda reports as total_memory (GiB), the base vLLM multiplies by gpuMemoryUtilization:
    # 0.4-0.9 GiB below the GFD/nvidia-smi figure. 0 = unknown (the capacity plan then says so and uses
    # the label figure, which over-promises by about half a GiB).
    torch_total_gib: float = 0.0

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024

    @property
    def torch_total_bytes(self) -> int:
        """The device total vLLM budgets from (torch's figure when known, else the label's)."""
        return round(self.torch_total_gib * 1024**3) if self.torch_total_gib else self.memory_bytes


# Memory figures: NVIDIA data sheets (A100 40/80 GB, H100 SXM5 80 GB HBM3, H200 141 GB HBM3e,
# L40S 48 GB GDDR6); MiB as nvidia-smi reports usable framebuffer on those parts. Bandwidth and TFLOPS:
# the same data sheets as quoted by BLIS `hardware_config.json` and LLM-Viewer `hardware_params.py`
# (../shared/notes/simulator.md section 4).
# torch totals, as logged by vLLM (`total_memory=` in its memory snapshot) or by torch's OOM message
# ("GPU 0 has a total capacity of X GiB"): H100 79.19, A100-40GB 39.39, L40S 44.42, H200 139.81
# (../shared/notes/kv-observed.md pattern 1); A100-80GB 79.15 (vllm-project/vllm#4408); H100 NVL 93.09,
# L4 22.03, A10G 22.06, B200 178.35 (OOM messages in public repos). H100 PCIe: assumed equal to SXM
# (same 81559 MiB label) (?).
GPU_PRODUCTS: dict[str, GPUProduct] = {
    p.key: p
    for p in (
        GPUProduct("A100-40GB", "NVIDIA-A100-SXM4-40GB", 40960, "ampere", 8, 0, 1555, 312, 0, 39.39),
        GPUProduct("A100-80GB", "NVIDIA-A100-SXM4-80GB", 81920, "ampere", 8, 0, 2039, 312, 0, 79.15),
        GPUProduct("H100-80GB", "NVIDIA-H100-80GB-HBM3", 81559, "hopper", 9, 0, 3350, 989, 1979, 79.19),
        GPUProduct("H100-PCIe-80GB", "NVIDIA-H100-PCIe", 81559, "hopper", 9, 0, 2000, 756, 1513, 79.19),
        GPUProduct("H100-NVL-94GB", "NVIDIA-H100-NVL", 95830, "hopper", 9, 0, 3900, 835, 1671, 93.09),
        GPUProduct("H200-141GB", "NVIDIA-H200", 143771, "hopper", 9, 0, 4800, 989, 1979, 139.81),
        GPUProduct("L4-24GB", "NVIDIA-L4", 23034, "ada-lovelace", 8, 9, 300, 121, 242, 22.03),
        GPUProduct("L40S-48GB", "NVIDIA-L40S", 46068, "ada-lovelace", 8, 9, 864, 362, 733, 44.42),
        GPUProduct("A10G-24GB", "NVIDIA-A10G", 23028, "ampere", 8, 6, 600, 70, 0, 22.06),
        GPUProduct("B200-180GB", "NVIDIA-B200", 183359, "blackwell", 10, 0, 8000, 2250, 4500, 178.35),
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
