"""/metrics text read with prometheus_client's parser: what it cannot parse is not valid
Prometheus exposition, and the test that reads it fails."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def series(text: str) -> dict[str, tuple[str, float]]:
    """Each sample as written (`name` or `name{label="value",...}`) -> (its family's type, its
    value). The parser renames a counter's samples to end in `_total` (llama-server's
    `llamacpp:n_tokens_max` is a counter without it), so the names are the text's own, matched
    one to one, in order, with the parser's samples."""
    parsed = [(family.type, sample) for family in text_string_to_metric_families(text)
              for sample in family.samples]
    written = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    found: dict[str, tuple[str, float]] = {}
    for (kind, sample), (name, value) in zip(parsed, written, strict=True):
        base = name.split("{")[0]
        labels = ",".join(f'{key}="{label}"' for key, label in sample.labels.items())
        assert sample.name in (base, f"{base}_total"), (sample, name)
        assert name == (f"{base}{{{labels}}}" if labels else base), (sample, name)
        assert sample.value == float(value), (sample, value)
        found[name] = (kind, sample.value)
    return found
