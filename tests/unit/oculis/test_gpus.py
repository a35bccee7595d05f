import pytest

from oculis import gpus


def test_lookup_by_short_name_and_by_gfd_label() -> None:
    assert gpus.lookup("H100-80GB").gfd_product == "NVIDIA-H100-80GB-HBM3"
    assert gpus.lookup("NVIDIA-A100-SXM4-80GB").key == "A100-80GB"
    assert gpus.lookup("A100-80GB").memory_bytes == 80 * 1024**3


def test_unknown_product_names_the_choices() -> None:
    with pytest.raises(KeyError, match="unknown GPU product 'V100'; use one of A100-40GB, A100-80GB, ") as err:
        gpus.lookup("V100")
    assert all(key in str(err.value) for key in gpus.GPU_PRODUCTS)
