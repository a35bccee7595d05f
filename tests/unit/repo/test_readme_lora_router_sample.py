"""README's LoRA section showed no router config (QA pass 3): a new user could not tell that outside
Kubernetes the upstream lists adapter names (not the GPUUpstream's {name, source, rank} objects). The sample
it now shows loads as written and means what its text says: a tier on the adapter, then the base model.
(Checked by hand against two `oculis sim serve --enable-lora` processes: `sql` and `llama-8b/sql` answer
with `x-oculis-adapter: sql`, an undeclared adapter is a 404 listing sql, support.)"""

import re
from pathlib import Path

from oculis import parse_config

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_lora_router_config_sample_loads_as_documented() -> None:
    text = README.read_text()
    section = text[text.index("### LoRA adapters as tiers"):text.index("### Autoscaling")]
    (sample,) = [b for b in re.findall(r"```yaml\n(.*?)```", section, re.S) if "adapters:" in b]
    cfg = parse_config(sample, "README.md")
    (up,) = cfg.upstreams
    assert up.adapters == ["sql", "support"] and len(up.replica_endpoints) == 2
    tuned, base = cfg.route("sql").tiers
    assert (tuned.upstream, tuned.adapter) == ("llama-8b", "sql")
    assert (base.upstream, base.adapter) == ("llama-8b", None)
