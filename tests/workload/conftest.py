import pytest

from hcsim.workload import load_workload_spec



@pytest.fixture
def llama13b():
    """The paper's workload: LLaMA2-13B with Table 4 costs, one fused vertex per decoder pass."""
    return load_workload_spec("llama2-13b", {"granularity": "decoder"})


@pytest.fixture
def xpus4():
    return [f"xpu{i}" for i in range(4)]
