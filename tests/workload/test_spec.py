"""Workload specs: built-in names, overrides, and every problem named with its field path."""

import pytest
import yaml

from hcsim.errors import ConfigError
from hcsim.workload import load_workload_spec


def test_the_paper_workload_as_configured_in_table5(llama13b):
    assert llama13b.model.decoders == 40 and llama13b.model.sequence == 4096 and llama13b.model.hidden == 5120
    assert (llama13b.costs, llama13b.batch_per_xpu, llama13b.precision) == ("table", 1, "fp32")
    assert len(llama13b.table.layers) == 15
    linear_k = llama13b.table.layers[1]
    assert (linear_k.printed, linear_k.fwd_flops.per_sample, linear_k.fwd_bytes.constant) == ("linear (K)", 195e9, 0.0488e9)
    assert llama13b.decoder_table() is llama13b.table


def test_overrides_take_dotted_keys_and_typed_values():
    spec = load_workload_spec("llama2-13b", {"training.batch_per_xpu": 4, "granularity": "layer",
                                             "gradients.algorithm": "coherent_ring", "costs": "shape"})
    assert (spec.batch_per_xpu, spec.granularity, spec.algorithm, spec.costs) == (4, "layer", "coherent_ring", "shape")
    assert spec.decoder_table().layers[-1].name == "add_mlp"


def test_a_spec_file_by_path(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny", "model": {"decoders": 2, "hidden": 64, "heads": 4, "ffn": 256,
                                                               "sequence": 32}}))
    spec = load_workload_spec(path)
    assert (spec.name, spec.costs, spec.granularity, spec.bucket, spec.algorithm) == ("tiny", "shape", "decoder", "decoder", "ring")


@pytest.mark.parametrize("overrides, message", [
    ({"training.batch_per_xpux": 2}, r"training\.batch_per_xpux: unknown key \(did you mean 'batch_per_xpu'\?\)"),
    ({"granularity": "op"}, r"granularity: 'op' is not one of layer, decoder"),
    ({"gradients.bucket": "decoders"}, r"gradients\.bucket: 'decoders' is not one of .* \(did you mean 'decoder'\?\)"),
    ({"training.batch_per_xpu": 0}, r"training\.batch_per_xpu: must be >= 1"),
    ({"training.precision": "fp4"}, r"training\.precision: 'fp4' is not one of"),
    ({"training.optimizer_bytes_per_parameter": 16}, r"optimizer_bytes_per_parameter: 16 has no unit"),
    ({"model.heads": 48}, r"hidden 5120 is not a multiple of heads 48"),
    ({"model.sequence": 2048}, r"the table is for sequence 4096 .* Fix: set costs: shape"),
    ({"training": 3}, r"training: expected a mapping"),
    ({"granularity.x": 1}, r"override 'granularity\.x': granularity is 'layer' in .*llama2-13b.yaml, not a mapping"),
])
def test_bad_values_are_named_by_their_path(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_workload_spec("llama2-13b", overrides)


def test_table_rows_are_checked(tmp_path):
    data = yaml.safe_load(open(load_workload_spec("llama2-13b").source))
    data["table"]["rows"][1]["fwd_flops"] = "195GB*b"
    data["table"]["rows"][2]["bwd_bytes"] = 0.39
    data["table"]["rows"][3]["name"] = "linear_k"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_workload_spec(path)
    text = str(err.value)
    assert r"table.rows[1].fwd_flops: cannot read '195GB'" in text
    assert "table.rows[2].bwd_bytes: expected a cost such as" in text
    data["table"]["rows"][1]["fwd_flops"] = "195GFLOP*b"
    data["table"]["rows"][2]["bwd_bytes"] = "0.39GB + 0.156GB*b"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="layer names must be unique, repeated: linear_k"):
        load_workload_spec(path)


def test_unknown_names_list_the_builtin_specs():
    with pytest.raises(ConfigError, match=r"llama2-14b: no such file.*llama2-13b"):
        load_workload_spec("llama2-14b")
