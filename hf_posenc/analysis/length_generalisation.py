"""Length generalisation: does translation quality hold up when inputs grow past the training lengths?

Two measurements over one line-aligned test set (sources, references):

* **joined sentences**: k consecutive test sentences joined into one input (sources with a space, references
  with a space), for k in (1, 2, 4, 8) by default. Sentences 1..k form the first input, k+1..2k the second, and
  so on; the last `len % k` sentences, which do not fill a group, are dropped (every input is exactly k
  sentences, so the mean length grows by k; each row counts what it dropped). k = 1 is the plain test set.
* **length buckets**: the plain test set split by source length in tokens (the model's tokenizer, end-of-
  sentence token included, i.e. the positions the encoder sees); edges (10, 20, 30, 40) give the buckets
  1-10, 11-20, 21-30, 31-40 and >40 tokens.

Every row reports sacreBLEU BLEU and chrF++ (`score_translations`), the hypothesis/reference length ratio
(sacreBLEU's sys_len / ref_len: below 1 the model stops early), the sentence ends in the hypotheses and in the
references (`count_sentence_ends`: with k sentences joined, a model that writes one sentence per input shows
it here), the inputs whose translation holds at least as many sentence ends as their reference (a paragraph of
k sentences translated whole), the mean source length in tokens and the number of inputs.

**The ceiling.** Each joined row with k > 1 also scores the same model's sentence-by-sentence translations of the
same groups: its k = 1 translations of the sentences of each group, joined like the sources (`ceiling`). It is
what the model achieves on these inputs when no input is longer than one sentence, on exactly the sentences the
row keeps (at k = 16 the groups hold 992 of 1,000 test sentences, and so does its ceiling), and it is not the
k = 1 BLEU: BLEU's n-gram and brevity terms score the same translations higher on longer segments. `kept` is the
row's BLEU over its ceiling's. It needs k = 1 among the measured k (it is in the default).

Decoding goes through `hf_posenc.pipeline.evaluation.decoding.translate` with the model's saved generation config
(beam 4, length penalty 0.6, up to source length + 50 new tokens, so the budget grows with the input). The
buckets reuse the k = 1 translations (the same inputs) when k = 1 was decoded; otherwise each bucket is
decoded on its own, so a model that cannot take the longest sentences still gets scores for the others.

Bounded tables (learned, PosNet, the linear mixers, and our sinusoids, which are a precomputed table of
`max_position_embeddings` rows as in Marian) raise `PositionLimitError` for inputs past their table, in the
encoder or during decoding. The harness catches exactly that error and records the row as "cannot", with the
positions needed, the table size and the module; any other error propagates.

    python -m hf_posenc.analysis.length_generalisation MODEL_DIR --source test.en --reference test.de \\
        --k 1 2 4 8 --buckets 10 20 30 40 --output length.json --plot length.png
"""

import argparse
import hashlib
import json
import operator
import re
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ..base import PositionLimitError
from ..pipeline.cli import check_number, run_cli
from ..pipeline.data.files import read_parallel
from ..pipeline.evaluation.decoding import load_translation_model, translate
from ..pipeline.evaluation.scoring import score_translations

DEFAULT_K = (1, 2, 4, 8)
DEFAULT_BUCKET_EDGES = (10, 20, 30, 40)
CACHE_NAME = "length_generalisation.json"
SERIES = ("joined", "buckets")
SCORE_KEYS = (
    "bleu",
    "chrf++",
    "length_ratio",
    "hyp_len",
    "ref_len",
    "hyp_sentence_ends",
    "ref_sentence_ends",
)
# A full stop, question or exclamation mark before a space or the end of the text, or a CJK one anywhere.
SENTENCE_END = re.compile(r"[.!?](?=\s|$)|[。！？]")

Translator = Callable[[list[str]], list[str]]  # sources -> hypotheses, in order
LengthCounter = Callable[[list[str]], list[int]]  # sources -> source lengths in tokens


def is_count(value) -> bool:
    """A whole number >= 1 (bools excluded, although Python counts them as ints)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_group_sizes(k: Sequence[int], name: str = "k") -> list[int]:
    sizes = list(k)
    if not sizes or not all(map(is_count, sizes)):
        raise ValueError(f"{name}={sizes!r}: expected one or more whole numbers >= 1, e.g. [1, 2, 4, 8]")
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"{name}={sizes!r} repeats a value; give each group size once")
    return sizes


def check_bucket_edges(edges: Sequence[int], name: str = "bucket_edges") -> list[int]:
    edges = list(edges)
    increasing = all(map(is_count, edges)) and all(a < b for a, b in zip(edges, edges[1:], strict=False))
    if not edges or not increasing:
        raise ValueError(
            f"{name}={edges!r}: expected strictly increasing whole numbers >= 1, e.g. [10, 20, 30, 40]"
        )
    return edges


def join_consecutive(sources: list[str], references: list[str], k: int) -> tuple[list[str], list[str]]:
    """Sentences i*k .. i*k+k-1 joined with a space, on both sides; the last `len % k` sentences are dropped."""
    check_group_sizes([k])
    if len(sources) != len(references):
        raise ValueError(
            f"{len(sources)} sources but {len(references)} references; they must be line-aligned"
        )
    starts = range(0, len(sources) - k + 1, k)
    return [" ".join(sources[i : i + k]) for i in starts], [" ".join(references[i : i + k]) for i in starts]


def bucket_bounds(edges: Sequence[int]) -> list[tuple[int, int | None]]:
    """(smallest, largest) source length of each bucket; the last bucket has no upper bound (None)."""
    edges = check_bucket_edges(edges)
    lows = [1] + [edge + 1 for edge in edges]
    return list(zip(lows, [*edges, None], strict=True))


def bucket_label(low: int, high: int | None) -> str:
    return f">{low - 1}" if high is None else f"{low}-{high}"


def bucket_of(length: int, edges: Sequence[int]) -> int:
    """Index of the bucket holding a source of `length` tokens (lengths equal to an edge go below it)."""
    return sum(length > edge for edge in edges)


def count_sentence_ends(text: str) -> int:
    """Sentence-final punctuation marks (`SENTENCE_END`) in `text`; decimal points and inner dots do not count."""
    return len(SENTENCE_END.findall(text))


def score_row(hypotheses: list[str], references: list[str]) -> dict:
    """BLEU, chrF++, sacreBLEU's hypothesis/reference length ratio, the sentence ends on each side of one set of
    translations, and the inputs whose translation holds at least as many sentence ends as its reference."""
    scores = score_translations(hypotheses, references, lengths=True)
    hypothesis_ends = list(map(count_sentence_ends, hypotheses))
    reference_ends = list(map(count_sentence_ends, references))
    return {
        "bleu": scores["bleu"],
        "chrf++": scores["chrf++"],
        "length_ratio": round(scores["hyp_len"] / scores["ref_len"], 3) if scores["ref_len"] else None,
        "hyp_len": scores["hyp_len"],
        "ref_len": scores["ref_len"],
        "hyp_sentence_ends": sum(hypothesis_ends),
        "ref_sentence_ends": sum(reference_ends),
        "inputs_with_all_sentence_ends": sum(map(operator.ge, hypothesis_ends, reference_ends)),
        "signatures": {"bleu": scores["bleu_signature"], "chrf++": scores["chrf++_signature"]},
    }


def add_ceiling(row: dict, plain_hypotheses: list[str], references: list[str]) -> None:
    """The row's ceiling (the k = 1 translations of its groups, joined; module docstring) and its BLEU over the
    ceiling's (`kept`), for a scored row with k > 1."""
    if row["k"] == 1 or row["bleu"] is None:
        return
    joined_hypotheses, joined_references = join_consecutive(plain_hypotheses, references, row["k"])
    scores = score_row(joined_hypotheses, joined_references)
    row["ceiling"] = {key: scores[key] for key in ("bleu", "chrf++", "length_ratio", "hyp_sentence_ends")}
    row["kept"] = round(row["bleu"] / scores["bleu"], 4) if scores["bleu"] else None


def empty_row(inputs: int, lengths: list[int]) -> dict:
    return {
        "inputs": inputs,
        "mean_source_tokens": round(statistics.fmean(lengths), 1) if lengths else None,
        **dict.fromkeys(SCORE_KEYS),
        "cannot": None,
    }


def decode_row(translator: Translator, sources: list[str], references: list[str], lengths: list[int]):
    """(row, hypotheses): the scored row, or a "cannot" row and None when a table is too short."""
    row = empty_row(len(sources), lengths)
    if not sources:
        return row, None
    started = time.monotonic()
    try:
        hypotheses = translator(sources)
    except PositionLimitError as error:
        row["cannot"] = {
            "positions": error.positions,
            "max_positions": error.max_positions,
            "module": error.module_name,
        }
        return row, None
    row.update(score_row(hypotheses, references), decode_seconds=round(time.monotonic() - started, 1))
    return row, hypotheses


def measure_length_generalisation(
    translator: Translator,
    count_tokens: LengthCounter,
    sources: list[str],
    references: list[str],
    k: Sequence[int] = DEFAULT_K,
    bucket_edges: Sequence[int] = DEFAULT_BUCKET_EDGES,
) -> dict:
    """Joined-sentence rows (one per k) and length-bucket rows, as a JSON-serialisable dict.

    `translator` maps sources to hypotheses and may raise `PositionLimitError` (recorded as "cannot");
    `count_tokens` gives each source's length in tokens. See the module docstring for the protocol.
    """
    sizes, edges = check_group_sizes(k), check_bucket_edges(bucket_edges)
    if len(sources) != len(references) or not sources:
        raise ValueError(
            f"{len(sources)} sources and {len(references)} references: need the same number, > 0"
        )
    joined_rows, plain_hypotheses = [], None
    for size in sizes:
        joined_sources, joined_references = join_consecutive(sources, references, size)
        row, hypotheses = decode_row(
            translator,
            joined_sources,
            joined_references,
            count_tokens(joined_sources) if joined_sources else [],
        )
        joined_rows.append({"k": size, "dropped_sentences": len(sources) % size, **row})
        if size == 1:
            plain_hypotheses = hypotheses

    lengths = count_tokens(sources)
    bucket_rows = []
    for index, (low, high) in enumerate(bucket_bounds(edges)):
        members = [i for i, length in enumerate(lengths) if bucket_of(length, edges) == index]
        bucket_sources = [sources[i] for i in members]
        bucket_references = [references[i] for i in members]
        bucket_lengths = [lengths[i] for i in members]
        if plain_hypotheses is not None and members:
            row = empty_row(len(members), bucket_lengths)
            row.update(score_row([plain_hypotheses[i] for i in members], bucket_references))
        else:
            row, _ = decode_row(translator, bucket_sources, bucket_references, bucket_lengths)
        bucket_rows.append({"bucket": bucket_label(low, high), "min_tokens": low, "max_tokens": high, **row})

    if plain_hypotheses is not None:
        for row in joined_rows:
            add_ceiling(row, plain_hypotheses, references)
    signatures = None  # the same for every scored row: kept once
    for row in joined_rows + bucket_rows:
        signatures = row.pop("signatures", None) or signatures
    return {
        "sentences": len(sources),
        "k": sizes,
        "bucket_edges": edges,
        "signatures": signatures,
        "joined": joined_rows,
        "buckets": bucket_rows,
    }


def length_generalisation(
    model,
    tokenizer,
    sources: list[str],
    references: list[str],
    k: Sequence[int] = DEFAULT_K,
    bucket_edges: Sequence[int] = DEFAULT_BUCKET_EDGES,
    batch_size: int = 64,
    bf16: bool = False,
    **generate_kwargs,
) -> dict:
    """The harness for one model: decoding with `translate` (the model's generation config unless
    `generate_kwargs` override it), lengths with the model's tokenizer."""

    def translator(batch: list[str]) -> list[str]:
        return translate(model, tokenizer, batch, batch_size=batch_size, bf16=bf16, **generate_kwargs)

    def count_tokens(batch: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(batch)["input_ids"]]

    result = measure_length_generalisation(translator, count_tokens, sources, references, k, bucket_edges)
    result["max_position_embeddings"] = getattr(model.config, "max_position_embeddings", None)
    return result


def text_fingerprint(sources: list[str], references: list[str]) -> str:
    digest = hashlib.sha256("\n".join(sources).encode() + b"\0" + "\n".join(references).encode())
    return digest.hexdigest()[:16]


def length_generalisation_for_model_dir(
    model_dir,
    sources: list[str],
    references: list[str],
    k: Sequence[int] = DEFAULT_K,
    bucket_edges: Sequence[int] = DEFAULT_BUCKET_EDGES,
    batch_size: int = 64,
    bf16: bool = False,
    refresh: bool = False,
) -> dict:
    """The harness for a saved model folder, cached as `length_generalisation.json` next to the model.

    The cache is reused when it was made with the same test text (a hash of sources and references), k, bucket
    edges and precision; `refresh=True` recomputes it.
    """
    model_dir = Path(model_dir)
    settings = {
        "text_sha256": text_fingerprint(sources, references),
        "k": check_group_sizes(k),
        "bucket_edges": check_bucket_edges(bucket_edges),
        "bf16": bf16,
    }
    cache = model_dir / CACHE_NAME
    if cache.is_file() and not refresh:
        cached = json.loads(cache.read_text())
        if cached.get("settings") == settings:
            return cached
    model, tokenizer = load_translation_model(model_dir)
    if torch.cuda.is_available():
        model = model.cuda()
    result = length_generalisation(
        model, tokenizer, sources, references, k, bucket_edges, batch_size=batch_size, bf16=bf16
    )
    result = {"settings": settings, **result}
    cache.write_text(json.dumps(result, indent=2) + "\n")
    return result


def cannot_cell(cannot: dict) -> str:
    return f"cannot (>{cannot['max_positions']} pos.)"


def cannot_description(cannot: dict) -> str:
    return f"cannot: {cannot['positions']} positions > {cannot['max_positions']} ({cannot['module']})"


def comparison_table(results: dict[str, dict], series: str = "joined") -> str:
    """Markdown: one row per model, BLEU and length ratio for every k of the joined-sentence rows (or every
    source-length bucket)."""
    if series not in SERIES:
        raise ValueError(f"series={series!r} is not known; allowed values: {', '.join(SERIES)}")
    key = (lambda row: f"k={row['k']}") if series == "joined" else (lambda row: f"{row['bucket']} tok.")
    columns = list(dict.fromkeys(key(row) for result in results.values() for row in result[series]))
    header = ["system"] + [f"{label} {column}" for column in columns for label in ("BLEU", "ratio")]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for name, result in results.items():
        rows = {key(row): row for row in result[series]}
        cells = [name]
        for column in columns:
            row = rows.get(column)
            if row is None or (row["cannot"] is None and row["bleu"] is None):
                cells += ["–", "–"]
            elif row["cannot"] is not None:
                cells += [cannot_cell(row["cannot"])] * 2
            else:
                cells += [f"{row['bleu']:.1f}", f"{row['length_ratio']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mean_over_seeds(results: Sequence[dict]) -> dict:
    """One result whose every row (k, or bucket) holds the mean scores of several seeds' results of one system
    on the same test set. A row one seed could not take is "cannot" (the table size is the config's, so every
    seed shares it); a row left unscored by one seed stays unscored."""
    mean = {"seeds": len(results)}
    for series in SERIES:
        key = "k" if series == "joined" else "bucket"
        labels = [[row[key] for row in result[series]] for result in results]
        if any(label != labels[0] for label in labels):
            raise ValueError(
                f"the seeds' {series} rows differ ({labels}); only results of one harness setting average"
            )
        mean[series] = [mean_row(rows) for rows in zip(*(result[series] for result in results), strict=True)]
    return mean


def mean_row(rows: Sequence[dict]) -> dict:
    """The mean of one k's (or bucket's) row over seeds; inputs and source lengths are the test set's."""
    cannot = next((row["cannot"] for row in rows if row["cannot"] is not None), None)
    mean = {**rows[0], "cannot": cannot}
    for name in SCORE_KEYS:
        values = [row.get(name) for row in rows]
        mean[name] = None if cannot or None in values else statistics.mean(values)
    return mean


def sentence_ends(row: dict) -> str:
    """Sentence ends per input of a scored row, as hypotheses / references ("–" in results from before they
    were counted)."""
    if row.get("hyp_sentence_ends") is None:
        return "–"
    return f"{row['hyp_sentence_ends'] / row['inputs']:.2f} / {row['ref_sentence_ends'] / row['inputs']:.2f}"


def results_table(result: dict) -> str:
    """Markdown: one row per k and per bucket of one model's results; a joined row with k > 1 gives its ceiling's
    BLEU and the share of it kept."""
    header = [
        "test set",
        "inputs",
        "mean source tokens",
        "BLEU",
        "chrF++",
        "length ratio",
        "sentence ends per input",
        "inputs with all sentence ends",
        "ceiling BLEU",
        "kept",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    labelled = [(f"k={row['k']} joined", row) for row in result["joined"]]
    labelled += [(f"{row['bucket']} tokens", row) for row in result["buckets"]]
    for label, row in labelled:
        mean = "–" if row["mean_source_tokens"] is None else f"{row['mean_source_tokens']:.1f}"
        if row["cannot"] is not None:
            scores = [cannot_description(row["cannot"]), *["–"] * 6]
        elif row["bleu"] is None:
            scores = ["–"] * 7
        else:
            scores = [
                f"{row['bleu']:.2f}",
                f"{row['chrf++']:.2f}",
                f"{row['length_ratio']:.3f}",
                sentence_ends(row),
                str(row.get("inputs_with_all_sentence_ends", "–")),
                f"{row['ceiling']['bleu']:.2f}" if "ceiling" in row else "–",
                f"{row['kept']:.1%}" if row.get("kept") is not None else "–",
            ]
        lines.append("| " + " | ".join([label, str(row["inputs"]), mean, *scores]) + " |")
    return "\n".join(lines)


def plot_length_generalisation(
    results: dict[str, dict], path, series: str = "joined", title: str = ""
) -> None:
    """BLEU (left) and length ratio (right) against mean source tokens, one line per model, as a PNG.

    `series` picks the joined-sentence rows or the length buckets. Rows a model cannot take, and empty
    buckets, have no point; the legend names the k (or buckets) a model could not take.
    """
    if series not in SERIES:
        raise ValueError(f"series={series!r} is not known; allowed values: {', '.join(SERIES)}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    figure, (bleu_axis, ratio_axis) = plt.subplots(1, 2, figsize=(11, 4))
    colours = plt.get_cmap("tab20").colors
    for index, (name, result) in enumerate(results.items()):
        # 20 colours, then the next line style: each of up to 60 models has its own look
        style = {"color": colours[index % 20], "linestyle": ("-", "--", ":")[index // 20 % 3], "marker": "o"}
        rows = result[series]
        scored = [row for row in rows if row["bleu"] is not None]
        impossible = [
            f"k={row['k']}" if series == "joined" else row["bucket"] for row in rows if row["cannot"]
        ]
        label = name + (f" (cannot: {', '.join(impossible)})" if impossible else "")
        x = [row["mean_source_tokens"] for row in scored]
        bleu_axis.plot(x, [row["bleu"] for row in scored], label=label, **style)
        ratio_axis.plot(x, [row["length_ratio"] for row in scored], **style)
    ratio_axis.axhline(1.0, color="grey", linewidth=0.8)
    for axis, ylabel in ((bleu_axis, "BLEU"), (ratio_axis, "hypothesis / reference length")):
        axis.set_xscale("log", base=2)
        axis.xaxis.set_major_formatter(ScalarFormatter())
        axis.set_xlabel("mean source tokens")
        axis.set_ylabel(ylabel)
    figure.suptitle(title or f"length generalisation ({series})")
    figure.tight_layout()
    # below both axes, so that no number of models covers a curve
    figure.legend(loc="upper center", bbox_to_anchor=(0.5, 0), ncol=3, fontsize=7, frameon=False)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", type=Path, help="folder with a saved model and its tokenizer")
    parser.add_argument(
        "--source", type=Path, required=True, help="test sources, one sentence per line (.gz ok)"
    )
    parser.add_argument("--reference", type=Path, required=True, help="line-aligned references")
    parser.add_argument(
        "--k", type=int, nargs="+", default=list(DEFAULT_K), help="sentences joined per input"
    )
    parser.add_argument(
        "--buckets",
        type=int,
        nargs="+",
        default=list(DEFAULT_BUCKET_EDGES),
        help="source-length bucket edges in tokens",
    )
    parser.add_argument("--max_sentences", type=int, default=None, help="use only the first N test pairs")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--bf16", action="store_true", help="decode under bf16 autocast")
    parser.add_argument("--output", type=Path, help="write the results as JSON")
    parser.add_argument("--plot", type=Path, help="write BLEU and length ratio against source length (PNG)")
    parser.add_argument(
        "--trust_remote_code",
        action="store_true",
        help="load the saved code instead of this package's classes (their limit errors are not "
        "recognised then: a too-short table stops the run)",
    )
    args = parser.parse_args(argv)
    try:
        check_group_sizes(args.k, name="--k")
        check_bucket_edges(args.buckets, name="--buckets")
        check_number("--batch_size", args.batch_size, minimum=1, integer=True)
        if args.max_sentences is not None:
            check_number("--max_sentences", args.max_sentences, minimum=1, integer=True)
    except ValueError as error:
        parser.error(str(error))

    text = read_parallel(args.source, args.reference, limit=args.max_sentences)
    model, tokenizer = load_translation_model(args.model, trust_remote_code=args.trust_remote_code)
    result = length_generalisation(
        model,
        tokenizer,
        text.source,
        text.target,
        args.k,
        args.buckets,
        batch_size=args.batch_size,
        bf16=args.bf16,
    )
    print(results_table(result))
    if args.output is not None:
        args.output.write_text(json.dumps(result, indent=2) + "\n")
    if args.plot is not None:
        plot_length_generalisation({args.model.name: result}, args.plot, title=str(args.model))


if __name__ == "__main__":
    run_cli(main)
