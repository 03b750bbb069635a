"""``rules.read_run_spec``: a spec.json that is not JSON, or not the one the run record hashed, is refused
with one line naming the object (it was a JSONDecodeError traceback, or silently trusted)."""

from __future__ import annotations

import json

import pytest

from gradlab import receipts as rules
from gradlab.contracts import Experiments
from gradlab.contracts.run_spec import RunSpec
from gradlab.errors import ContractViolation, IntegrityError
from gradlab.settings import load_settings
from gradlab.stores import keys, open_stores

RUN_ID = "gradlab-20260101T000000-5bec0001"


def test_a_damaged_or_replaced_spec_is_refused_naming_it() -> None:
    settings = load_settings()
    stores = open_stores(settings)
    spec = RunSpec.from_resolved(Experiments().resolve("gradlab__bandit/ppo"), seed=0, run_id=RUN_ID)
    rules.open_run(stores, spec)
    good = rules.read_run_spec(stores, RUN_ID)
    assert good == spec.model_dump(mode="json")
    path = settings.home / "stores" / "control" / keys.run_spec(RUN_ID)
    assert path.is_file()
    url = stores.control.url(keys.run_spec(RUN_ID))
    path.write_text('{"run_id": 5')
    with pytest.raises(ContractViolation, match=f"^{url}: not JSON"):
        rules.read_run_spec(stores, RUN_ID)
    path.write_text("[1]")
    with pytest.raises(ContractViolation, match="expected a JSON object, found list"):
        rules.read_run_spec(stores, RUN_ID)
    path.write_text(json.dumps({**good, "seed": 7}))
    with pytest.raises(IntegrityError, match=r"sha256 expected [0-9a-f]{64} \(run record\)"):
        rules.read_run_spec(stores, RUN_ID)
