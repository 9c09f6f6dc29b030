"""Regenerate the tables that docs/ derives from the code, so that the docs cannot drift from it:

* docs/training.md, section "recipes": every recipe's settings, read from hf_posenc/pipeline/training/recipes/*.yaml;
* docs/architecture.md, section "hyperparameters": every module hyperparameter, its type, default and meaning,
  read from the module classes.

    python -m tools.reference_tables # rewrite the sections (make docs)
    python -m tools.reference_tables --check  # exit 1 if a section is out of date

A section is the text between `<!-- BEGIN name -->` and `<!-- END name -->`; the rest of each file is kept.
"""

import argparse
import re
import sys
from pathlib import Path

from hf_posenc import POSITION_ENCODINGS, TOKEN_MIXERS
from hf_posenc.pipeline.training.arguments import load_recipe, recipe_names

REPO = Path(__file__).resolve().parents[1]

# Recipe table columns: header -> how a recipe's settings fill the cell.
RECIPE_COLUMNS = {
    "data": lambda r: r.get("hf_dataset") or Path(r.get("data_dir", "shared/data/multi30k")).name,
    "pair": lambda r: f"{r.get('source_lang', 'en')}-{r.get('target_lang', 'de')}",
    "model": lambda r: (
        f"d{r['d_model']}, {r['layers']}+{r['layers']}, {r['heads']} heads, FFN {r['ffn_dim']}, dropout {r['dropout']}"
    ),
    "batch": lambda r: f"{r['max_tokens']} tokens x {r.get('gradient_accumulation_steps', 1)}",
    "schedule": lambda r: (
        f"lr {r['learning_rate']} "
        + (
            f"planned for the budget (warm-up ≤ {r['warmup_steps']}, linear decay)"
            if r.get("schedule") == "budget" and r.get("minutes")
            else f"{r['lr_scheduler_type']}, warm-up {r['warmup_steps']}"
        )
        + f", Adam β2 {r['adam_beta2']}, label smoothing {r['label_smoothing_factor']}"
    ),
    "budget": lambda r: (
        (f"{r['minutes']} min" if r.get("minutes") else f"{r['max_steps']} updates")
        + (f", average last {r['average_last']}" if r.get("average_last") else "")
        + (f", average best {r['average_best']}" if r.get("average_best") else "")
    ),
    "decoding": lambda r: f"beam {r.get('num_beams', 4)}",
    "module settings": lambda r: (
        ", ".join(f"{k} {v}" for k, v in r.get("config_overrides", {}).items()) or "defaults"
    ),
}


def cell(value) -> str:
    """Text for a markdown table cell: a literal | would end the cell."""
    return str(value).replace("|", "\\|")


def recipe_table() -> str:
    rows = ["| recipe | " + " | ".join(RECIPE_COLUMNS) + " |", "|" + " --- |" * (len(RECIPE_COLUMNS) + 1)]
    for name in recipe_names():
        recipe = load_recipe(name)
        rows.append(
            f"| `{name}` | " + " | ".join(cell(column(recipe)) for column in RECIPE_COLUMNS.values()) + " |"
        )
    return "\n".join(rows)


def hyperparameter_table() -> str:
    rows = ["| module | field | type | default | meaning |", "| --- | --- | --- | --- | --- |"]
    seen = set()
    for name, module in {**POSITION_ENCODINGS, **TOKEN_MIXERS}.items():
        for field, hyperparameter in module.hyperparameters.items():
            if field in seen:
                continue
            seen.add(field)
            kind = getattr(hyperparameter.type, "__name__", str(hyperparameter.type))
            choices = f" ({', '.join(map(str, hyperparameter.choices))})" if hyperparameter.choices else ""
            rows.append(
                f"| `{name}` | `{field}` | {cell(kind)} | `{hyperparameter.default!r}` | "
                f"{cell(hyperparameter.doc + choices)} |"
            )
    return "\n".join(rows)


SECTIONS = {
    REPO / "docs" / "training.md": {"recipes": recipe_table},
    REPO / "docs" / "architecture.md": {"hyperparameters": hyperparameter_table},
}


def render(path: Path) -> str:
    """The file's text with each of its sections regenerated."""
    text = path.read_text(encoding="utf-8")
    for name, table in SECTIONS[path].items():
        pattern = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(\n<!-- END {name} -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"{path} has no section <!-- BEGIN {name} --> ... <!-- END {name} -->")
        text = pattern.sub(lambda match, table=table: match.group(1) + table() + match.group(2), text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only report sections that are out of date")
    args = parser.parse_args(argv)
    stale = []
    for path in SECTIONS:
        text = render(path)
        if text != path.read_text(encoding="utf-8"):
            stale.append(path)
            if not args.check:
                path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{'out of date' if args.check else 'rewrote'}: {path.relative_to(REPO)}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
