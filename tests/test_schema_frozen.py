"""The JSON output schemas (`estimate`, `plan`) are frozen per `SCHEMA_VERSION`.

`tests/golden/schema/v<N>.json` holds the schemas of version N and `FROZEN` the hash of each
file. Changing an output model therefore fails `test_generated_schema_matches_the_golden_of_this
_version` until SCHEMA_VERSION is bumped and a new golden is added:

    python -c "import json; from autoparallel.schema import schema_for, SCHEMA_VERSION as v; \
print(json.dumps({'schema_version': v, 'estimate': schema_for('estimate'), \
'plan': schema_for('plan'), 'capacity': schema_for('capacity')}, indent=2, sort_keys=True))" \
> tests/golden/schema/v<N>.json

and rewriting a released golden instead fails `test_released_goldens_are_unchanged`.
"""

import hashlib
import json
from pathlib import Path

from autoparallel.schema import SCHEMA_VERSION, EstimateOut, PlanOut, schema_for
from conftest import run_cli

GOLDEN = Path(__file__).parent / "golden" / "schema"
FROZEN = {
    "1": "76a95d8b0c0a9458a79587eda8a8fe2655143dac53fd7a9ac2827393ee79f33c",
    "2": "a71a9639704ee361f283e516af771cd79d128da8061e4510774b30febc5115c4",
    "3": "0ea2f026188a2ea3c19a5b2f4b5d003355881487e586a142b269482624696ab3",
    "4": "742d6be25ac4a583b4cbfcd3c835a0a81cdf1ffe81ef817be10331824454285d",
    "5": "851ee8be7b06abc2fd40fb5206084ef5726f67de356610665b87def867daabe0",
    "6": "5f6c95570feaca242e59a5e04ac0a724e4fa9e578323e2ed8e0ebe3c528828b3",
    "7": "72a95ac4dabbf4f95db2fb4a949dc561b4d6cf32c2245cfa03f55c2700543007",
    "8": "d1d7f359f87a8fe435d6c732ffd71b9d21fef920d7b1b2fc4d82c40dd3cb9ec5",
}
"""sha256 of each released golden (canonical JSON: sorted keys, no spaces)."""
OUTPUTS = ("estimate", "plan", "capacity")
"""Output schemas frozen in the golden of the current version (v1-v2: estimate and plan only)."""


def _digest(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _golden(version: str) -> dict:
    return json.loads((GOLDEN / f"v{version}.json").read_text())


def test_generated_schema_matches_the_golden_of_this_version():
    path = GOLDEN / f"v{SCHEMA_VERSION}.json"
    assert path.exists(), f"SCHEMA_VERSION {SCHEMA_VERSION} has no golden {path.name}; see module doc"
    current = {"schema_version": SCHEMA_VERSION} | {w: schema_for(w) for w in OUTPUTS}
    assert _golden(SCHEMA_VERSION) == current, (
        "an output schema changed: bump SCHEMA_VERSION in autoparallel/schema.py and add "
        "a golden for the new version (see this module's docstring)")


def test_released_goldens_are_unchanged():
    files = {p.stem[1:] for p in GOLDEN.glob("v*.json")}
    assert files == set(FROZEN), "every released schema version needs a golden and a FROZEN hash"
    for version, digest in FROZEN.items():
        data = _golden(version)
        assert data["schema_version"] == version
        assert _digest(data) == digest, f"golden v{version} was edited; released versions are frozen"


def test_each_version_changes_the_schema():
    versions = sorted(FROZEN, key=int)
    assert versions[-1] == SCHEMA_VERSION
    for old, new in zip(versions, versions[1:]):
        a, b = _golden(old), _golden(new)
        assert (a["estimate"], a["plan"]) != (b["estimate"], b["plan"]), f"v{new} repeats v{old}"


def test_schema_command_prints_the_versioned_schema():
    for what in OUTPUTS:
        r = run_cli("schema", what)
        assert r.returncode == 0, r.stderr
        data = json.loads(r.stdout)
        assert data == _golden(SCHEMA_VERSION)[what]
        assert data["$comment"] == f"autoparallel schema version {SCHEMA_VERSION}"


def test_every_output_field_is_described():
    """A documented schema: every property of every output object has a description."""
    for what in OUTPUTS:
        schema = schema_for(what)
        for name, obj in [(what, schema)] + list(schema.get("$defs", {}).items()):
            for prop, spec in obj.get("properties", {}).items():
                assert spec.get("description"), f"{name}.{prop} has no description"


def test_plan_json_validates_against_the_schema_models():
    r = run_cli("plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len",
                "4096", "--global-batch", "64", "--top", "3", "--format", "json")
    assert r.returncode == 0, r.stderr
    out = PlanOut.model_validate(json.loads(r.stdout))  # extra="forbid": no key more or less
    assert out.schema_version == SCHEMA_VERSION and len(out.ranked) == 3
    assert out.problem.gpus_per_node == 8 and out.ranked[0].rank == 1
    EstimateOut.model_validate(out.ranked[0].model_dump(exclude={"rank", "tied", "robustness"}))
