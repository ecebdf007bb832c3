"""The dataset task: local files read with `datasets` (JSONL, JSON, Parquet, save_to_disk),
veRL's nested keys and chat-message prompts, a deterministic held-out split, epochs in a
seeded order, chat templates, long prompts dropped; and every bad input refused with a
message that names the field and the fix, at config time and again at load."""

import json
import os

import datasets
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from engine.config import ConfigError, validate_config
from engine.tasks import task_for
from engine.tasks.dataset import DatasetTask
from engine.tinymodel import build_tokenizer

ROWS = [{"question": f"tom has {a} pens and gets {b} more how many pens now",
         "answer": f"{a}+{b}={a + b}\n#### {a + b}", "solution": f"{a}+{b}={a + b}",
         "level": a % 3}
        for a in range(1, 11) for b in range(1, 5)]


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run_cfg(task: dict, **top):
    data = {"task": {"type": "dataset", "prompt_key": "question", **task},
            "warm_start": {"steps": 0}, **top}
    return validate_config(data)


def error_of(task: dict, **top) -> tuple[str, str]:
    with pytest.raises(ConfigError) as exc:
        run_cfg(task, **top)
    return exc.value.errors[0]


def logs():
    lines = []
    return lines, lambda m, level="info": lines.append((level, m))


# --------------------------------------------------------------------------- formats

def test_jsonl_rows_become_problems_with_their_row(tmp_path):
    cfg = run_cfg({"path": jsonl(tmp_path / "d.jsonl", ROWS)})
    task = task_for(cfg, build_tokenizer())
    p = task.train_problems(0, 1)[0]
    source = next(r for r in ROWS if r["question"] == p.prompt)
    assert p.answer == source["answer"] and p.row == source
    assert task.is_correct(p, source["solution"]) is True
    assert task.is_correct(p, "1+1=999") is False
    assert task.is_correct(p, "no number here") is None


def test_json_parquet_and_save_to_disk_load_the_same_problems(tmp_path):
    ds = datasets.Dataset.from_list(ROWS)
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    ds.to_parquet(str(tmp_path / "d.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    prompts = []
    for path in ("d.json", "d.parquet", "saved"):
        task = task_for(run_cfg({"path": str(tmp_path / path)}), build_tokenizer())
        prompts.append(sorted(p.prompt for p in task.train + task.eval_problems()))
    assert prompts[0] == prompts[1] == prompts[2] == sorted(r["question"] for r in ROWS)


def test_verl_layout_reads_nested_answers_and_chat_message_prompts(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": r["question"]}],
             "reward_model": {"ground_truth": str(i), "style": "rule"},
             "data_source": "gsm8k"} for i, r in enumerate(ROWS)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "verl"))
    tok = chat_tokenizer()
    cfg = run_cfg({"path": str(tmp_path / "verl"), "prompt_key": "prompt",
                   "answer_key": "reward_model.ground_truth", "chat_template": True,
                   "system_prompt": "answer with a number"})
    task = task_for(cfg, tok)
    p = task.train_problems(0, 1)[0]
    assert p.prompt.startswith("<|im_start|>system\nanswer with a number<|im_end|>\n"
                               "<|im_start|>user\ntom has ")
    assert p.prompt.endswith("<|im_start|>assistant\n")
    assert p.answer == p.row["reward_model"]["ground_truth"]
    assert p.row["data_source"] == "gsm8k"


# --------------------------------------------------------------------------- split, epochs

def test_the_held_out_split_is_the_same_for_every_seed_and_row_order(tmp_path):
    a = task_for(run_cfg({"path": jsonl(tmp_path / "a.jsonl", ROWS), "eval_fraction": 0.25}),
                 build_tokenizer())
    b = task_for(run_cfg({"path": jsonl(tmp_path / "b.jsonl", ROWS[::-1]),
                          "eval_fraction": 0.25}, model={"seed": 7}), build_tokenizer())
    held = [p.prompt for p in a.eval_problems()]
    assert held == [p.prompt for p in b.eval_problems()]
    assert len(held) == 10                                   # 25 % of 40 distinct prompts
    assert not set(held) & {p.prompt for p in a.train}
    assert len(a.train) == 30


def test_epochs_walk_every_row_once_in_an_order_set_by_the_seed(tmp_path):
    path = jsonl(tmp_path / "d.jsonl", ROWS)
    task = task_for(run_cfg({"path": path, "eval_fraction": 0.25}), build_tokenizer())
    n = 5                                                    # 30 rows: 6 steps an epoch
    epoch0 = [p.prompt for s in range(6) for p in task.train_problems(s, n)]
    epoch1 = [p.prompt for s in range(6, 12) for p in task.train_problems(s, n)]
    assert sorted(epoch0) == sorted(epoch1) == sorted(p.prompt for p in task.train)
    assert epoch0 != epoch1                                  # reshuffled each epoch
    again = task_for(run_cfg({"path": path, "eval_fraction": 0.25}), build_tokenizer())
    assert [p.prompt for p in again.train_problems(7, n)] == \
        [p.prompt for p in task.train_problems(7, n)]        # a function of the index
    other = task_for(run_cfg({"path": path, "eval_fraction": 0.25}, model={"seed": 1}),
                     build_tokenizer())
    assert [p.prompt for s in range(6) for p in other.train_problems(s, n)] != epoch0
    assert task.train_problems(10**6, 3) == task.train_problems(10**6, 3)   # resumed draws


def test_an_eval_file_is_held_out_and_its_prompts_never_train(tmp_path):
    path = jsonl(tmp_path / "train.jsonl", ROWS)
    held = jsonl(tmp_path / "test.jsonl", ROWS[:4] + [{**ROWS[0], "question": "ana has 1 pen"}])
    lines, log = logs()
    task = task_for(run_cfg({"path": path, "eval_path": held, "eval_size": 3}),
                    build_tokenizer(), log=log)
    assert len(task.eval_problems()) == 3
    assert len(task.train) == len(ROWS) - 4
    assert "4 training row(s) with a held-out prompt dropped" in lines[0][1]


def test_long_prompts_are_dropped_and_counted_in_a_log_line(tmp_path):
    rows = ROWS + [{**ROWS[0], "question": "a" * 200}, {**ROWS[1], "question": "b" * 150}]
    lines, log = logs()
    task = task_for(run_cfg({"path": jsonl(tmp_path / "d.jsonl", rows),
                             "max_prompt_tokens": 100}), build_tokenizer(), log=log)
    assert all(len(p.prompt) < 100 for p in task.train + task.eval_problems())
    [(level, line)] = lines
    assert level == "warning" and "2 prompt(s) over max_prompt_tokens=100 dropped" in line


def test_prompts_are_counted_in_the_tokenizers_tokens_after_rendering(tmp_path):
    tok = chat_tokenizer()
    rows = ROWS + [{**ROWS[0], "question": ROWS[0]["question"] + " and then some more"}]
    path = jsonl(tmp_path / "d.jsonl", rows)
    longest = max(len(tok(tok.apply_chat_template(
        [{"role": "user", "content": r["question"]}], tokenize=False,
        add_generation_prompt=True))["input_ids"]) for r in rows)
    keep = task_for(run_cfg({"path": path, "chat_template": True,
                             "max_prompt_tokens": longest}), tok)
    assert len(keep.train) + len(keep.eval_problems()) == len(rows)
    lines, log = logs()
    task_for(run_cfg({"path": path, "chat_template": True, "max_prompt_tokens": longest - 1}),
             tok, log=log)
    assert "1 prompt(s) over max_prompt_tokens" in lines[0][1]


def test_a_template_that_writes_bos_itself_gets_no_second_one(tmp_path):
    tok = chat_tokenizer(bos_in_template=True)
    task = task_for(run_cfg({"path": jsonl(tmp_path / "d.jsonl", ROWS),
                             "chat_template": True}), tok)
    ids = tok(task.train_problems(0, 1)[0].prompt)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id


def test_warm_start_demonstrations_come_from_sft_key(tmp_path):
    path = jsonl(tmp_path / "d.jsonl", ROWS)
    with_sft = task_for(run_cfg({"path": path, "sft_key": "solution"}), build_tokenizer())
    p = with_sft.train_problems(0, 1)[0]
    assert with_sft.demonstration(p) == p.row["solution"]
    plain = task_for(run_cfg({"path": path}), build_tokenizer())
    assert plain.demonstration(p) == p.answer
    assert with_sft.identity() != plain.identity()           # a warm start cache key part


# --------------------------------------------------------------------------- bad inputs

def test_a_missing_file_names_the_field_and_the_forms_accepted(tmp_path):
    field, msg = error_of({"path": str(tmp_path / "nope.jsonl")})
    assert field == "task.path"
    assert "no such file or directory" in msg and ".jsonl, .json or .parquet" in msg
    field, msg = error_of({"path": jsonl(tmp_path / "d.jsonl", ROWS),
                           "eval_path": "missing/test.jsonl"})
    assert field == "task.eval_path" and "no such file" in msg


def test_an_unreadable_file_is_refused(tmp_path):
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    field, msg = error_of({"path": str(tmp_path / "bin.jsonl")})
    assert field == "task.path" and "is not UTF-8 text" in msg and "re-encode" in msg
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    field, msg = error_of({"path": str(tmp_path / "bad.parquet")})
    assert field == "task.path" and "cannot be read as Parquet" in msg
    (tmp_path / "d.csv").write_text("question,answer\n")
    field, msg = error_of({"path": str(tmp_path / "d.csv")})
    assert "has suffix '.csv'" in msg and "convert it" in msg
    os.mkdir(tmp_path / "plain_dir")
    field, msg = error_of({"path": str(tmp_path / "plain_dir")})
    assert "without state.json" in msg


def test_a_dataset_dict_directory_points_at_its_splits(tmp_path):
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                          "test": datasets.Dataset.from_list(ROWS[:3])}
                         ).save_to_disk(str(tmp_path / "dd"))
    field, msg = error_of({"path": str(tmp_path / "dd")})
    assert field == "task.path" and "DatasetDict (splits train, test)" in msg
    assert msg.endswith(f"{tmp_path / 'dd'}/train")


def test_a_missing_column_lists_the_columns_there_are(tmp_path):
    path = jsonl(tmp_path / "d.jsonl", ROWS)
    field, msg = error_of({"path": path, "prompt_key": "problem"})
    assert field == "task.prompt_key"
    assert "'problem' is not a column" in msg and "question, answer, solution, level" in msg
    field, msg = error_of({"path": path, "answer_key": "reward_model.ground_truth"})
    assert field == "task.answer_key" and "dotted for nested columns" in msg
    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    field, msg = error_of({"path": str(tmp_path / "d.parquet"), "sft_key": "worked"})
    assert field == "task.sft_key" and "its schema has question, answer" in msg


def test_an_empty_dataset_is_refused(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    field, msg = error_of({"path": str(tmp_path / "empty.jsonl")})
    assert (field, msg.split(" holds")[1]) == ("task.path", " no rows; point it at data "
                                                            "with at least one example")


def test_a_bad_line_is_named_by_its_number(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + "\n{oops\n")
    field, msg = error_of({"path": str(path)})
    assert field == "task.path" and "line 3 is not valid JSON" in msg
    assert msg.endswith("fix or delete that line")
    path.write_text(json.dumps({**ROWS[0], "question": 42}) + "\n")
    field, msg = error_of({"path": str(path)})
    assert field == "task.prompt_key" and "line 1" in msg and "holds a int, not text" in msg
    path.write_text(json.dumps({**ROWS[0], "answer": None}) + "\n")
    field, msg = error_of({"path": str(path)})
    assert field == "task.answer_key" and "is null" in msg


def test_contradictory_settings_are_refused(tmp_path):
    path = jsonl(tmp_path / "d.jsonl", ROWS)
    field, msg = error_of({"path": path, "eval_path": path, "eval_fraction": 0.2})
    assert field == "task.eval_fraction" and "set only one" in msg
    field, msg = error_of({"path": path, "system_prompt": "be brief"})
    assert field == "task.system_prompt" and "chat_template = true" in msg
    field, msg = error_of({"path": path}, reward={"type": "reward_model"})
    assert field == "reward.type" and 'use reward.type = "math"' in msg


def test_the_engine_checks_again_at_load_with_the_same_message(tmp_path):
    path = tmp_path / "d.jsonl"
    jsonl(path, ROWS)
    cfg = run_cfg({"path": str(path)})
    path.write_text(path.read_text() + "{oops\n")                 # changed after validation
    with pytest.raises(ConfigError) as at_load:
        task_for(cfg, build_tokenizer())
    assert at_load.value.errors[0] == error_of({"path": str(path)})


def test_load_time_only_problems_name_their_field(tmp_path):
    path = jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(ConfigError) as no_template:
        task_for(run_cfg({"path": path, "chat_template": True}), build_tokenizer())
    assert no_template.value.errors[0][0] == "task.chat_template"
    assert "has no chat template" in no_template.value.errors[0][1]
    msgs = jsonl(tmp_path / "m.jsonl", [{"prompt": [{"role": "user", "content": "hi"}],
                                         "answer": "1"}] * 3)
    with pytest.raises(ConfigError) as messages:
        task_for(run_cfg({"path": msgs, "prompt_key": "prompt"}), build_tokenizer())
    assert "holds chat messages; set task.chat_template = true" in messages.value.errors[0][1]
    with pytest.raises(ConfigError) as too_short:
        task_for(run_cfg({"path": path, "max_prompt_tokens": 5}), build_tokenizer())
    assert too_short.value.errors[0][0] == "task.max_prompt_tokens"
    with pytest.raises(ConfigError) as empty_disk:
        datasets.Dataset.from_list(ROWS).select([]).save_to_disk(str(tmp_path / "e"))
        task_for(run_cfg({"path": str(tmp_path / "e")}), build_tokenizer())
    assert "holds no rows" in empty_disk.value.errors[0][1]


# --------------------------------------------------------------------------- helpers

def chat_tokenizer(bos_in_template: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained here on a small corpus, with a ChatML template
    (and, like Llama 3, optionally one that writes BOS itself while encoding adds it)."""
    specials = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [r["question"] + " " + r["answer"] for r in ROWS] * 3
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400,
                                                        special_tokens=specials))
    if bos_in_template:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="</s>")
    fast.chat_template = (("{{ bos_token }}" if bos_in_template else "") +
                          "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                          "{{ m['content'] }}<|im_end|>\n{% endfor %}"
                          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return fast


def test_a_dataset_task_is_a_task_with_the_runs_seed(tmp_path):
    cfg = run_cfg({"path": jsonl(tmp_path / "d.jsonl", ROWS)}, model={"seed": 5})
    task = task_for(cfg, build_tokenizer())
    assert isinstance(task, DatasetTask) and task.seed == 5
