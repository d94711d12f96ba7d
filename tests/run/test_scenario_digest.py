"""The scenario digest (sweep point keys, results' inputs_hash) covers the keys set to other than their default."""

import dataclasses

from hcsim.run.scenario import Scenario


def test_a_default_valued_key_leaves_the_digest_unchanged_and_any_other_value_changes_it():
    base = Scenario(xpus=8, coherent=False)
    assert dataclasses.replace(base, tp=1, schedule="1f1b").digest() == base.digest()  # defaults spelled out
    assert dataclasses.replace(base, tp=2).digest() != base.digest()
    assert dataclasses.replace(base, name="other").digest() == base.digest()  # a label, not an input
    assert Scenario(xpus=8).digest() != base.digest()


def test_the_keys_of_issue_26_leave_every_earlier_digest_unchanged():
    """precision and spill default to the specs' own (None): committed sweep points keep their keys."""
    base = Scenario(xpus=8, coherent=False)
    assert dataclasses.replace(base, precision=None, spill=None).digest() == base.digest()
    assert dataclasses.replace(base, precision="fp32").digest() != base.digest()
    assert dataclasses.replace(base, spill="allow").digest() != base.digest()
