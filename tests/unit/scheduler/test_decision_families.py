"""The spec's decision families (scheduler/decision_families.py): each recognised offline from a
tiny GGUF that carries the metadata llama.cpp reads of that family (`<arch>.decision.type`, the
fitted temperatures, laya's `max_head_tokens`, the systemone template), the families refused by
name, and the per-family rules applied when a decision job is planned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from scheduler.contract.errors import InvalidRequest, NotSupported
from scheduler.contract.jobs import (
    DecisionJob,
    DecisionQuestion,
    SystemOneInput,
    SystemOneOption,
    SystemOneQuestion,
)
from scheduler.decision_families import FAMILIES
from scheduler.decision_meta import (
    DecisionCaps,
    DecisionMetaError,
    file_output_modalities,
    native_caps,
    output_modalities,
)
from scheduler.gguf_meta import read_metadata
from tests.tiny_gguf import add_metadata
from worker.decisions.plan import label_scores, plan_decision
from worker.decisions.systemone_heads import HeadPrompter
from worker.decisions.systemone_prompt import FamilyPrompter

SYSTEMONE = "{{ state }}|{{ instructions }}|{% for o in options %}{{ o.key }};{% endfor %}"
"""A `tokenizer.chat_template.systemone`: llama.cpp requires one of every decision model."""

FAMILY_FILES: dict[str, tuple[str, dict[str, Any]]] = {
    # the architecture each family's published GGUFs name, and their decision keys
    "openjev": ("qwen35", {"qwen35.decision.temperature.choice": "1.25"}),
    "pplx-decider": ("qwen35", {"qwen35.decision.temperature.noul": 0.8}),
    "lfm2-d1": ("lfm2", {"lfm2.decision.temperature.choice.3_5": "1.150000"}),
    "lfm2-d1-omni": ("lfm2", {"lfm2.decision.temperature.choice.2": "1.250000",
                              "lfm2.decision.temperature.score.3_5": "1.350000",
                              "lfm2.attention.causal": 0, "lfm2.decision.block_count": 1}),
    "laya": ("modern-bert", {"modern-bert.decision.max_head_tokens": 512}),
    "clef": ("qwen35", {"qwen35.decision.temperature.choice": 1.1}),
}


def write_family(path: Path, arch: str, decision_type: str | None,
                 extra: dict[str, Any] | None = None) -> Path:
    """A header-only GGUF of `arch` whose decision type is `decision_type`."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_token_list(["<unk>", "[MASK]", "[SEP]", "A", "B"])
    metadata: dict[str, Any] = {"tokenizer.chat_template.systemone": SYSTEMONE, **(extra or {})}
    if decision_type is not None:
        metadata[f"{arch}.decision.type"] = decision_type
    add_metadata(writer, metadata)
    writer.add_tensor("x", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("name", list(FAMILY_FILES))
def test_each_family_is_recognised_offline(tmp_path: Path, name: str) -> None:
    arch, extra = FAMILY_FILES[name]
    path = write_family(tmp_path / f"{name}.gguf", arch, name, extra)
    caps = native_caps(read_metadata(path))
    assert caps is not None and caps.family is not None and caps.family.name == name
    assert caps.mode == "native" and caps.types == ["choice", "score", "noul"]
    assert caps.max_options == (52 if name == "openjev" else 255)
    assert file_output_modalities(path) == ["decisions"]  # as llama-server reports it
    assert caps.accepts_null_state == (name in ("lfm2-d1", "lfm2-d1-omni"))
    assert caps.serves_text == (name != "clef")
    assert caps.family.one_batch == (name in ("laya", "clef", "lfm2-d1-omni"))
    assert caps.head_tokens == (512 if name == "laya" else None)
    # the same architecture without a decision type is a text model
    assert file_output_modalities(write_family(tmp_path / "plain.gguf", arch, None)) == ["text"]


def test_temperatures_are_read_by_type_and_option_bucket(tmp_path: Path) -> None:
    caps = native_caps(read_metadata(write_family(
        tmp_path / "omni.gguf", *FAMILY_FILES["lfm2-d1-omni"][:1], "lfm2-d1-omni",
        {**FAMILY_FILES["lfm2-d1-omni"][1], "lfm2.decision.temperature.choice": 2.0})))
    assert caps is not None
    assert caps.temperature("choice", 2) == 1.25  # choice.2
    assert caps.temperature("choice", 4) == 2.0  # no choice.3_5: the type's
    assert caps.temperature("score", 5) == 1.35  # score.3_5
    assert caps.temperature("score", 6) == 1.0 and caps.temperature("noul", 2) == 1.0


@pytest.mark.parametrize("name", ["granite-switch", "vllm-decision2", "vllm-d3"])
def test_families_without_a_published_identification_are_refused_by_name(
        tmp_path: Path, name: str) -> None:
    path = write_family(tmp_path / "m.gguf", "llama", name)
    with pytest.raises(DecisionMetaError, match=f"'{name}' is not supported: the spec names"):
        native_caps(read_metadata(path))
    assert file_output_modalities(path) == ["text"]  # llama-server: an unknown type is text


@pytest.mark.parametrize(("name", "why"), [
    ("lev", "does not list it"), ("kev", "does not list it"), ("nimble", "does not list it"),
    ("d1", "renamed the type lfm2-d1"), ("maybe-someday", "unsupported decision model type")])
def test_other_decision_types_are_refused_with_the_reason(tmp_path: Path, name: str,
                                                         why: str) -> None:
    with pytest.raises(DecisionMetaError, match=why):
        native_caps(read_metadata(write_family(tmp_path / "m.gguf", "lfm2", name)))


@pytest.mark.parametrize("extra", [
    {}, {"modern-bert.decision.max_head_tokens": 0}, {"modern-bert.decision.max_head_tokens": "x"}])
def test_laya_needs_its_token_budget(tmp_path: Path, extra: dict[str, Any]) -> None:
    with pytest.raises(DecisionMetaError, match="max_head_tokens"):
        native_caps(read_metadata(write_family(tmp_path / "l.gguf", "modern-bert", "laya",
                                               extra)))


@pytest.mark.parametrize("value", ["0", "-1", "warm", 0.0])
def test_an_unusable_temperature_is_an_error(tmp_path: Path, value: Any) -> None:
    with pytest.raises(DecisionMetaError, match="invalid decision temperature"):
        native_caps(read_metadata(write_family(tmp_path / "t.gguf", "qwen35", "openjev",
                                               {"qwen35.decision.temperature.choice": value})))


def test_a_refused_family_stops_the_worker_with_its_name(tmp_path: Path) -> None:
    from worker.process.decision_parts import worker_decision_caps
    from worker.runtime.model import ModelLoadError

    path = write_family(tmp_path / "granite.gguf", "granite", "granite-switch")
    with pytest.raises(ModelLoadError, match=r"granite\.gguf: decision model type "
                                             r"'granite-switch' is not supported"):
        worker_decision_caps(path, prompted=True)


def test_output_modalities_of_a_family_that_is_also_a_text_model() -> None:
    from scheduler.decision_families import FamilyRules

    both = FamilyRules(name="x", readout="label-logits", output_modalities=("text", "decisions"))
    assert output_modalities(DecisionCaps(mode="native", family=both)) == ["text", "decisions"]
    assert output_modalities(DecisionCaps(mode="native")) == ["text", "decisions"]  # llamaq's
    assert output_modalities(DecisionCaps(mode="prompted")) == ["text"]


# -- the rules, when a job is planned (a word per token) ---------------------------------------


class WordVocab:
    """One token per word, each word its own id."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return [self.ids.setdefault(word, len(self.ids)) for word in text.split()]


def family_caps(tmp_path: Path, name: str) -> Any:
    arch, extra = FAMILY_FILES[name]
    caps = native_caps(read_metadata(write_family(tmp_path / f"{name}.gguf", arch, name, extra)))
    assert caps is not None
    return caps


def job(prefix_words: int, suffix_words: int, n_questions: int = 1,
        labels: tuple[str, ...] = ("yes", "no"), qtype: Any = "noul") -> DecisionJob:
    return DecisionJob(model="m", prefix="s " * prefix_words, questions=[
        DecisionQuestion(id=f"q{i}", type=qtype, suffix="w " * suffix_words,
                         labels=list(labels)) for i in range(n_questions)])


def test_openjev_takes_52_options_and_the_others_255(tmp_path: Path) -> None:
    options = tuple(f"o{i}" for i in range(53))
    with pytest.raises(InvalidRequest, match="at most 52"):
        plan_decision(job(4, 4, labels=options, qtype="choice"), WordVocab(),
                      family_caps(tmp_path, "openjev"), 4096)
    plan = plan_decision(job(4, 4, labels=options, qtype="choice"), WordVocab(),
                         family_caps(tmp_path, "pplx-decider"), 4096)
    assert len(plan.questions[0].labels) == 53


def test_label_logit_families_are_planned_with_their_temperatures(tmp_path: Path) -> None:
    caps = family_caps(tmp_path, "lfm2-d1")
    plan = plan_decision(job(4, 4, labels=("a", "b", "c"), qtype="choice"), WordVocab(),
                         caps, 4096, n_ubatch=8)  # not a one-batch family: longer is fine
    assert plan.questions[0].temperature == 1.15  # choice.3_5


@pytest.mark.parametrize("name", ["laya", "clef", "lfm2-d1-omni"])
def test_a_head_family_without_its_request_is_a_501_after_the_checks(tmp_path: Path,
                                                                     name: str) -> None:
    caps = family_caps(tmp_path, name)
    with pytest.raises(NotSupported, match=f"{name} answers from a decision head"):
        plan_decision(job(10, 10), WordVocab(), caps, 4096)
    with pytest.raises(InvalidRequest, match="at most 255"):
        plan_decision(job(4, 4, labels=tuple(f"o{i}" for i in range(256)), qtype="choice"),
                      WordVocab(), caps, 4096)


# -- a decision-head family's prompts, as llama.cpp builds them
# (worker/decisions/systemone_heads.py) ---


class HeadWords(WordVocab):
    """Words, with the [CLS], [SEP] and [MASK] tokens a head family's vocabulary has."""

    def __init__(self) -> None:
        super().__init__()
        self.ids.update({"[CLS]": 0, "[SEP]": 1, "[MASK]": 2})
        self.sep, self.mask = 1, 2

    def text_of(self, token: int) -> str:
        return {v: k for k, v in self.ids.items()}[token]


LAYA = ("[CLS] {{ instructions }} [SEP]{% for o in options %} [MASK] {{ o.key }}"
        "{% if o.description %} {{ o.description }}{% endif %}{% endfor %} [SEP] {{ state }} [SEP]")
D1OMNI = ("{{ sep }}{{ mark_question }}{{ instructions }}{% for o in options %}{{ sep }}"
          "{{ mark_option }}[MASK] {{ o.key }}{% endfor %}{{ sep }}{{ mark_state }}{{ state }}"
          "{{ sep }}end")
CLEF = ("{{ state if state is string else state | tojson }}{% for q in questions %}{{ sep }}"
        "{{ mark_question }}{{ q.instructions }}{% for o in q.options %}{{ sep }}"
        "{{ mark_option }}{{ o.key }}{% endfor %}{% endfor %}{{ sep }}end")


def head(name: str, template: str, head_tokens: int | None = None) -> tuple[Any, DecisionCaps]:
    caps = DecisionCaps(mode="native", family=FAMILIES[name], systemone_template=template,
                        head_tokens=head_tokens)
    return HeadPrompter(caps, HeadWords()), caps


def request(state: Any, *questions: SystemOneQuestion) -> DecisionJob:
    systemone = SystemOneInput(state=state, questions=list(questions))
    return DecisionJob(model="m", prefix="x", systemone=systemone, questions=[
        DecisionQuestion(id=q.id, type=q.type, suffix="x", labels=[o.key for o in q.options])
        for q in questions])


def described(qid: str, n_words: int, keys: list[str], n_about: int) -> SystemOneQuestion:
    return SystemOneQuestion(id=qid, type="choice", instructions="w " * n_words, options=[
        SystemOneOption(key=k, description="d " * n_about) for k in keys])


def test_laya_cuts_the_question_and_options_to_its_trained_budget() -> None:
    family, caps = head("laya", LAYA, head_tokens=20)
    question = described("q", 30, ["a", "b", "c"], 60)  # options of 62 tokens, a 30-word question
    vocab = HeadWords()
    # the options are shared out evenly (4 tokens each of 20 - 16), the question gets 8:
    # [CLS] 8 [SEP] 3 x 4, then [SEP] and the state's 5 words and [SEP]
    assert family.prompt_lengths(request("s " * 5, question).systemone, vocab) == [29]
    with pytest.raises(InvalidRequest, match=r"has 29 tokens: laya evaluates a prompt in one "
                                             r"batch, which must fit in --ubatch-size \(28\)"):
        plan_decision(request("s " * 5, question), vocab, caps, 4096, 28, family)
    with pytest.raises(NotSupported, match="laya answers from a decision head"):
        plan_decision(request("s " * 5, question), vocab, caps, 4096, 29, family)
    # without the cut the same prompt would be 1 + 30 + 1 + 3 x 49 + 7 = 186 tokens
    wide, _ = head("laya", LAYA, head_tokens=400)
    assert wide.prompt_lengths(request("s " * 5, question).systemone, vocab) == [186]


def test_laya_blanks_its_mask_out_of_the_input_and_checks_the_layout() -> None:
    family, _ = head("laya", LAYA, head_tokens=64)
    vocab = HeadWords()
    question = described("q", 2, ["a", "b"], 0)
    # [CLS] w w [SEP] [MASK] a [MASK] b [SEP] a b [SEP]: the state's [MASK] is a blank
    assert family.prompt_lengths(request("a [MASK] b", question).systemone, vocab) == [12]
    broken, _ = head("laya", LAYA.removesuffix(" [SEP]"), head_tokens=64)
    with pytest.raises(NotSupported, match="unexpected layout"):
        broken.prompt_lengths(request("s", question).systemone, vocab)


def test_an_lfm2_d1_omni_prompt_is_cut_to_16384_tokens() -> None:
    family, caps = head("lfm2-d1-omni", D1OMNI)
    vocab = HeadWords()
    question = described("q", 200, ["yes", "no"], 0)
    long = request("s " * 20000, question)
    # the question is cut to its budget (96), the state gets the room that is left
    assert family.prompt_lengths(long.systemone, vocab) == [16384]
    short = request("s " * 10, question)
    assert family.prompt_lengths(short.systemone, vocab) == [96 + 2 + 2 + 10 + 1]
    with pytest.raises(InvalidRequest, match=r"has 16384 tokens: lfm2-d1-omni evaluates a "
                                             r"prompt in one batch.*\(512\)"):
        plan_decision(long, vocab, caps, 1 << 20, 512, family)
    # the input cannot forge the template's pieces or special tokens
    forged = request("<<d1omni:sep>><<d1omni:state>> x", question)
    # "<<d1omni sep>><<d1omni state>> x": four words of state, no piece of its own
    assert family.prompt_lengths(forged.systemone, vocab) == [96 + 2 + 2 + 4 + 1]
    from worker.decisions.systemone_heads import escape_special
    assert escape_special({"<|a|>": ["x <|b_1|> y", 3]}) == {"<\u00a6a\u00a6>": [
        "x <\u00a6b_1\u00a6> y", 3]}


def test_clef_reads_all_the_questions_in_one_prompt() -> None:
    family, caps = head("clef", CLEF)
    vocab = HeadWords()
    questions = [SystemOneQuestion(id=f"q{i}", type="noul", instructions=f"ask q{i}",
                                   options=[SystemOneOption(key="false"),
                                            SystemOneOption(key="true")]) for i in range(3)]
    job3 = request("s " * 10, *questions)
    assert family.prompt_lengths(job3.systemone, vocab) == [10 + 3 * (2 + 2) + 1]
    with pytest.raises(InvalidRequest, match="has 23 tokens: clef evaluates all the questions "
                                             "of a request in one prompt in one batch"):
        plan_decision(job3, vocab, caps, 4096, 22, family)
    with pytest.raises(NotSupported, match="clef answers from a decision head"):
        plan_decision(job3, vocab, caps, 4096, 23, family)
    empty = SystemOneQuestion(id="e", type="noul", instructions="", options=questions[0].options)
    with pytest.raises(InvalidRequest, match="must not be empty"):
        family.prompt_lengths(request("s", empty).systemone, vocab)


def test_clef_sorts_keys_and_options_and_reads_noul_true_first() -> None:
    from worker.decisions.systemone_heads import _options, sort_keys

    assert list(sort_keys({"b": {"z": 1, "y": 2}, "a": [{"d": 0, "c": 1}]})) == ["a", "b"]
    assert list(sort_keys({"b": {"z": 1, "y": 2}})["b"]) == ["y", "z"]
    choice = described("c", 1, ["shipping", "billing"], 0)
    assert [o["key"] for o in _options(choice, True, True)] == ["billing", "shipping"]
    noul = SystemOneQuestion(id="n", type="noul", instructions="i", options=[
        SystemOneOption(key="false"), SystemOneOption(key="true")])
    assert [o["key"] for o in _options(noul, True, True)] == ["true", "false"]


def test_a_head_family_needs_its_marker_tokens() -> None:
    class Plain(WordVocab):
        mask = sep = -1

        def text_of(self, token: int) -> str:
            return ""

    for name in ("laya", "lfm2-d1-omni"):
        caps = DecisionCaps(mode="native", family=FAMILIES[name], systemone_template="x",
                            head_tokens=8)
        with pytest.raises(DecisionMetaError, match="no mask"):
            HeadPrompter(caps, Plain())


# -- a label-logit family's own prompts and labels (worker/decisions/systemone_prompt.py) --

TEMPLATE = ("{{ state if state is string else state | tojson }} | {{ instructions }} |"
            "{% for o in options %} {{ o.label | default('-') }}={{ o.key }}{% endfor %} | end")


def prompter(name: str, vocab: WordVocab) -> tuple[FamilyPrompter, DecisionCaps]:
    caps = DecisionCaps(mode="native", family=FAMILIES[name],
                        max_options=FAMILIES[name].max_options, systemone_template=TEMPLATE,
                        temperatures={"choice.3_5": 1.5})
    return FamilyPrompter(caps, vocab), caps


def sq(qid: str, qtype: Any, keys: list[str]) -> SystemOneQuestion:
    return SystemOneQuestion(id=qid, type=qtype, instructions=f"ask {qid}",
                             options=[SystemOneOption(key=k) for k in keys])


def words(vocab: WordVocab, tokens: list[int]) -> list[str]:
    names = {v: k for k, v in vocab.ids.items()}
    return [names[t] for t in tokens]


def test_openjev_reads_one_letter_per_option_and_noul_true_first() -> None:
    vocab = WordVocab()
    family, _ = prompter("openjev", vocab)
    choice, noul = family.questions(SystemOneInput(state={"order": 7}, questions=[
        sq("route", "choice", ["billing", "shipping", "technical"]),
        sq("angry", "noul", ["false", "true"])]), vocab)
    assert words(vocab, choice.tokens) == ['{"order":', "7}", "|", "ask", "route", "|", "-=billing",
                                           "-=shipping", "-=technical", "|", "end"]
    assert [words(vocab, g) for g in choice.groups] == [["A"], ["B"], ["C"]]
    # the model reads noul as (true, false): true is A; the answer's order is (true, false)
    assert words(vocab, noul.tokens)[-4:-2] == ["-=true", "-=false"]
    assert [words(vocab, g) for g in noul.groups] == [["A"], ["B"]]


def test_pplx_decider_gives_its_codes_to_the_template_and_reads_noul_false_first() -> None:
    vocab = WordVocab()
    family, _ = prompter("pplx-decider", vocab)
    assert len(family.codes) == 255 and family.codes[26] == "AA"
    (noul,) = family.questions(SystemOneInput(state="s", questions=[
        sq("q", "noul", ["false", "true"])]), vocab)
    assert words(vocab, noul.tokens)[-4:-2] == ["A=false", "B=true"]
    assert [words(vocab, g) for g in noul.groups] == [["B"], ["A"]]  # (true, false)


def test_lfm2_d1_labels_depend_on_the_question_type() -> None:
    vocab = WordVocab()
    family, _ = prompter("lfm2-d1", vocab)
    built = family.questions(SystemOneInput(state="s", questions=[
        sq("c", "choice", ["billing", "shipping"]), sq("l", "choice", ["x", "y"]),
        sq("s", "score", ["0", "1", "2"]), sq("n", "noul", ["false", "true"])]), vocab)
    assert words(vocab, built[0].tokens)[-4:-2] == ["A=billing", "B=shipping"]
    assert [words(vocab, g) for g in built[0].groups] == [["A"], ["B"]]  # " A" is the same word
    assert words(vocab, built[1].tokens)[-4:-2] == ["x=x", "y=y"]  # single letters: themselves
    assert [words(vocab, g) for g in built[2].groups] == [["0"], ["1"], ["2"]]
    assert [words(vocab, g) for g in built[3].groups] == [["yes", "Yes", "YES"],
                                                         ["no", "No", "NO"]]
    many = family.question("s", sq("m", "choice", [f"opt{i}" for i in range(30)]), vocab)
    assert words(vocab, many.groups[0]) == ["00"] and words(vocab, many.groups[29]) == ["29"]


def test_a_label_that_is_not_one_token_stops_an_openjev_worker() -> None:
    class Spaced(WordVocab):
        def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
            return super().tokenize(f"▁ {text}", add_special, parse_special)

    with pytest.raises(DecisionMetaError, match="'A' is not a single token"):
        prompter("openjev", Spaced())


def test_a_family_job_is_planned_from_its_own_prompts() -> None:
    vocab = WordVocab()
    family, caps = prompter("lfm2-d1", vocab)
    systemone = SystemOneInput(state="the same state", questions=[
        sq("a", "choice", ["p", "q", "r"]), sq("b", "noul", ["false", "true"])])
    job = DecisionJob(model="m", prefix="unused", systemone=systemone, questions=[
        DecisionQuestion(id="a", type="choice", suffix="x", labels=["p", "q", "r"]),
        DecisionQuestion(id="b", type="noul", suffix="x", labels=["yes", "no"])])
    plan = plan_decision(job, vocab, caps, 4096, prompter=family)
    assert words(vocab, plan.prefix) == ["the", "same", "state", "|", "ask"]
    a, b = plan.questions
    assert words(vocab, a.suffix)[0] == "a" and words(vocab, b.suffix)[0] == "b"
    assert a.temperature == 1.5 and b.temperature == 1.0  # choice.3_5
    assert b.groups == [[0, 1, 2], [3, 4, 5]] and len(b.labels) == 6
    # an option scores the best of its labels' log-probabilities
    logprobs: dict[tuple[int, ...], dict[int, float]] = {
        (): {t[0]: -float(i) for i, t in enumerate(b.labels)}}
    assert label_scores(b, logprobs) == [0.0, -3.0]


def test_the_routers_catalog_reads_a_familys_architecture(tmp_path: Path) -> None:
    """Router mode's `/models` (scheduler/catalog.py): unloaded models are read offline."""
    from scheduler.catalog import ModelEntry, architecture_of

    def arch(path: Path) -> list[str]:
        entry = ModelEntry(name=path.stem, source="models_dir", local_path=str(path))
        return architecture_of(entry).output_modalities

    assert arch(write_family(tmp_path / "d1.gguf", "lfm2", "lfm2-d1")) == ["decisions"]
    assert arch(write_family(tmp_path / "g.gguf", "granite", "granite-switch")) == ["text"]
    # a family file without its systemone template still says what it is (llama-server reads
    # only the type); its worker would not start
    no_template = tmp_path / "bare.gguf"
    writer = gguf.GGUFWriter(str(no_template), "qwen35")
    add_metadata(writer, {"qwen35.decision.type": "clef"})
    writer.add_tensor("x", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert arch(no_template) == ["decisions"]
    with pytest.raises(DecisionMetaError, match='no "systemone" template'):
        native_caps(read_metadata(no_template))


def test_a_template_that_refuses_an_input_is_a_400_that_says_why() -> None:
    vocab = WordVocab()
    caps = DecisionCaps(mode="native", family=FAMILIES["openjev"], max_options=52,
                        systemone_template="{% if state == 'x' %}{{ raise_exception('no x') }}"
                                           "{% endif %}{{ state }} end")
    family = FamilyPrompter(caps, vocab)
    with pytest.raises(InvalidRequest, match='"systemone" template failed: no x'):
        family.question("x", sq("q", "noul", ["false", "true"]), vocab)
    assert words(vocab, family.question("y", sq("q", "noul", ["false", "true"]),
                                        vocab).tokens) == ["y", "end"]
    with pytest.raises(DecisionMetaError, match="does not parse"):
        FamilyPrompter(caps.model_copy(update={"systemone_template": "{% if %}"}), vocab)
