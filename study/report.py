"""docs/results.md, built from the results folder alone: the papers' claims and how each is tested, then per
language pair every table (BLEU per seed with marks for how each run was made, mean ± sd, the gap to the
reference system with paired bootstrap resampling per seed, paper 1's marks, and a verdict that also needs the gap
to exceed the seed noise), length generalisation, the claims' verdicts with their tally, the verdicts one more
seed could move, the word-order probe, the n-gram sweep (paper 1 Fig. 4) of the best system and pictures of what
the models learned about positions. Text below the notes marker of an existing report is kept."""

import statistics
import time
from pathlib import Path

from transformers import AutoModelForSeq2SeqLM

from hf_posenc.analysis.position_plots import plot_learned_positions
from hf_posenc.pipeline.evaluation.scoring import ngram_sweep, plot_ngram_sweep
from hf_posenc.pipeline.export.model_card import paper_deviations
from hf_posenc.pipeline.training.arguments import load_recipe
from hf_posenc.pipeline.training.hardware import Hardware

from .claims import SEED_SDS, SIGNIFICANT_P, STRONG_P, p_text
from .extrapolation import extrapolation_section
from .length import length_section
from .results import KERNEL_NAMES, Results, mean_sd, table_lines
from .runs import Run, test_set
from .tables import REFERENCE_SYSTEM, TABLE_TITLES, TABLES, row_config
from .verdicts import claims_table, detectable, margin_section, pair_evidence, protocol_section, tally

NOTES_MARKER = "<!-- Everything below this line is kept when python -m study rewrites this file. -->"


def bootstrap_cell(tests: list[dict]) -> str:
    """'p=0.012**, p=0.300, p=0.0999*' for the seeds' BLEU bootstrap tests (`claims.p_text`)."""
    return ", ".join(f"p={p_text(test['bleu']['p_value'])}{test['bleu']['significance']}" for test in tests)


class Report(Results):
    """docs/results.md (`--report`) for one recipe, with its pictures beside it."""

    def __init__(self, args):
        super().__init__(args)
        self.docs = Path(args.report).parent
        self.docs.mkdir(parents=True, exist_ok=True)
        self.lines: list[str] = []

    def write(self) -> Path:
        self.lines += [*self.header(), *protocol_section(self)]
        for pair in self.pairs:
            self.pair_section(pair)
        path = Path(self.args.report)
        kept = path.read_text().partition(NOTES_MARKER)[2] if path.is_file() else ""
        path.write_text("\n".join(self.lines) + f"\n{NOTES_MARKER}{kept or chr(10)}")
        return path

    def header(self) -> list[str]:
        args, recipe = self.args, load_recipe(self.args.recipe)
        budget = self.budget or f"{recipe['minutes']} minutes of"
        averaged = (
            f"the average of the last {recipe['average_last']} checkpoints, "
            if recipe.get("average_last")
            else ""
        )
        return [
            f"# Results: every positional module on Multi30k, recipe `{args.recipe}`",
            "",
            f"Written by `python -m study {' '.join(args.command)}` on {time.strftime('%Y-%m-%d')}.",
            f"Every run: recipe `{args.recipe}` ({recipe.get('description', '')}), {budget} updates, {averaged}"
            "the same data, tokenizer settings and evaluation (beam 4, length penalty 0.6, source length + 50 new "
            f"tokens; sacreBLEU on detokenised `{self.test_split}`, 1,000 sentences). Machines: {self.machines()}. "
            f"Attention kernels (each run's own speed probe chooses, pipeline/training/hardware.py): {self.kernels()}. "
            f"Significance: paired bootstrap resampling ({args.bootstrap_samples} samples) of each seed against the "
            f"reference system's run of the same seed, ** p < {STRONG_P:.2f}, * p < {SIGNIFICANT_P:.2f} (paper 1's marks); "
            "a p-value prints with three decimals, four where three would round it across a level (0.0999, not "
            "0.100). Δ BLEU compares with the reference's runs of the same seeds. **The better/worse rule**, one "
            "reading for every verdict column and every > or < claim: a gap is **better**/**worse** only if every "
            f"paired seed's bootstrap is significant (p < {SIGNIFICANT_P:.2f}) and |Δ| exceeds {SEED_SDS} × the "
            "**larger** of the two systems' seed standard deviations (each over all its seeds); otherwise it is a "
            "**tie**. The larger one, because a gap inside the noisier system's own spread is one that retraining "
            "that system produces by itself; the smaller one (a second reading that 'two standard deviations of "
            "the system or of the reference' admits) would let the quiet baseline vouch for a system whose seeds do "
            "not agree. Where neither has two seeds no noise is measured: **one seed** (no call); where only one side "
            "has two, the bar is that side's alone and the call is **provisional**. Marks after a seed's BLEU, "
            "each table's footnotes naming the runs: ‡ trained on a GPU; † an update count other than the budget; "
            "ʳ resumed from a checkpoint after an interruption; ᵏ an attention kernel other than the one most runs "
            "on its kind of device used; ᵗ a thread count other than most runs'. The papers' main tables use "
            "Transformer base (d_model 512, 6+6 layers, FFN 2048); every module runs at the paper's settings but "
            "where the config column says otherwise.",
            "",
        ]

    def pair_section(self, pair: str) -> None:
        test = test_set(self.args.recipe, pair, self.args.test_limit)
        self.lines += [f"## {pair}", ""]
        shown, unrun = self.shown_tables(pair)
        for table in shown:
            self.table(pair, table, test.target)
        if unrun:
            self.lines += [f"Not run for {pair}: {'; '.join(TABLE_TITLES[t] for t in unrun)}.", ""]
        self.lines += length_section(self, pair, self.docs)
        self.lines += extrapolation_section(self, pair, self.docs)
        self.claims(pair, test.target)
        self.probe_table(pair)
        self.sweep(pair, test.target)
        self.pictures(pair)

    def shown_tables(self, pair: str) -> tuple[list[str], list[str]]:
        """The tables of `--tables` shown for a pair, and those named in one line instead: the main table always
        shows, an ablation table once one of its own rows (not a main-table system) has a run for the pair."""
        main = {system.name for system in TABLES["main"]}

        def unrun(table: str) -> bool:
            own = [system.name for system in TABLES[table] if system.name not in main]
            return table != "main" and not any(self.runs_of(pair, name) for name in own)

        return [t for t in self.args.tables if not unrun(t)], [t for t in self.args.tables if unrun(t)]

    def table(self, pair: str, table: str, references: list[str]) -> None:
        self.lines += [f"### {TABLE_TITLES[table]}", ""]
        self.lines += table_lines(
            ["system", "config", "parameters", "BLEU per seed", "BLEU", "Δ BLEU", "chrF++"]
            + [f"bootstrap vs {REFERENCE_SYSTEM} (BLEU p per seed)", "verdict"]
        )
        notes: dict[str, list[str]] = {}  # footnote -> the runs it is about
        for system in TABLES[table]:
            fields = ", ".join(f"{k}={v}" for k, v in {**system.overrides, **system.training}.items())
            deviations = paper_deviations(row_config(system, self.args.recipe))
            config = "; ".join([fields or "defaults", *deviations])
            runs, bleu, _, delta, tests, call = self.comparison(
                pair, system.name, REFERENCE_SYSTEM, references
            )
            if not runs:
                self.lines.append(f"| {system.name} | {config} | | not run | | | | | |")
                continue
            degenerate = {run.seed: symptoms for run in runs if (symptoms := self.degenerate(run))}
            if degenerate:
                call = "degenerate: " + "; ".join(f"seed {seed}: {s[0]}" for seed, s in degenerate.items())
            chrf = [self.read(run, "scores.json")["chrf++"] for run in runs]
            parameters = self.read(runs[0], "scores.json")["parameters"] / 1e6
            per_seed = " / ".join(
                f"{b:.2f}{self.marks(run, notes)}" for run, b in zip(runs, bleu, strict=True)
            )
            gap = "" if delta is None else f"{delta:+.2f}"
            cells = [system.name, config, f"{parameters:.2f}M", per_seed, mean_sd(bleu), gap, mean_sd(chrf)]
            self.lines.append("| " + " | ".join([*cells, bootstrap_cell(tests), call]) + " |")
        self.lines.append("")
        for mark, runs in notes.items():
            self.lines += [f"{mark}: {', '.join(runs)}.", ""]

    def marks(self, run: Run, notes: dict[str, list[str]]) -> str:
        """The marks of how a run was made (the header lists them): † updates other than the budget, ʳ resumed
        from a checkpoint, ‡ trained on a GPU, ᵏ an attention kernel other than its device's usual one, ᵗ a
        thread count other than the usual one; `notes` collects the footnotes that say which runs and how."""
        scores, marks, name = self.read(run, "scores.json"), "", f"`{run.system}` seed {run.seed}"
        hardware, (threads, kernels) = scores["hardware"], self.usual
        if self.budget is not None and scores["steps"] != self.budget:
            marks += "†"
            averaged = scores.get("averaged_checkpoints") or ["the final weights"]
            budget = f"{scores['steps']} updates against a budget of {self.budget}"
            notes.setdefault(f"† {budget}, {averaged[0]} to {averaged[-1]} averaged", []).append(name)
        if scores.get("resumed_from"):
            marks += "ʳ"
            resumed = (
                "ʳ resumed from a checkpoint after an interruption (the checkpoint; updates of the attempt that "
                "finished)"
            )
            updates = scores.get("updates_this_attempt")
            notes.setdefault(resumed, []).append(
                f"{name} ({scores['resumed_from']}; {updates} update{'s' * (updates != 1)})"
            )
        if hardware["device"] != "cpu":
            marks += "‡"
            notes.setdefault(f"‡ trained on {Hardware.from_record(hardware).line()}", []).append(name)
        kernel, usual = scores.get("attention_backend"), kernels.get(hardware["device"])
        if kernel and kernel != usual:
            marks += "ᵏ"
            device = "CPU" if hardware["device"] == "cpu" else "GPU"
            other = f"ᵏ {KERNEL_NAMES.get(kernel, kernel)} attention on a {device}, where most {device} runs used "
            notes.setdefault(other + KERNEL_NAMES.get(usual, usual), []).append(name)
        if threads is not None and hardware["threads"] != threads:
            marks += "ᵗ"
            count = f"ᵗ {hardware['threads']} threads, where most runs used {threads}"
            notes.setdefault(count, []).append(name)
        return marks

    def claims(self, pair: str, references: list[str]) -> None:
        """The pair's claims table with its tally and what the seeds can detect, then the verdicts on a
        margin (`verdicts.py`)."""
        evidence = pair_evidence(self, pair, references)
        self.lines += ["### The papers' claims", "", *claims_table(evidence), ""]
        self.lines += [f"Tally, {tally(evidence)}. {detectable(evidence)}".rstrip(), ""]
        self.lines += margin_section(self, pair, evidence, references)

    def probe_table(self, pair: str) -> None:
        self.lines += [
            "### Word-order probe of the trained models (paper 1 Eq. 9 vs 13)",
            "",
            f"First {self.args.probe_sentences} test sources, 2 permutations each, greedy decoding; every cell "
            "the mean over the system's seeds. Gap = ‖Enc(PX) − P·Enc(X)‖/‖Enc(X)‖ (0: the encoder cannot see word "
            "order); BLEU vs original = sacreBLEU of the permuted sources' translations against the original "
            "translations (100: order ignored).",
            "",
            *table_lines(
                ["system", "seeds", "BLEU", "gap (shuffle)", "gap (local swap)"]
                + ["BLEU vs original (shuffle)", "BLEU vs original (local swap)"]
            ),
        ]
        for system in TABLES["main"]:
            runs = self.runs_of(pair, system.name)
            if not runs:
                continue
            probes = [self.read(run, "word_order_probe.json") for run in runs]
            cells = [
                f"{statistics.mean(probe[kind][name] for probe in probes):.{digits}f}"
                for name, digits in (("equivariance_gap", 3), ("bleu_vs_original", 1))
                for kind in ("shuffle", "local_swap")
            ]
            bleu = statistics.mean(map(self.bleu, runs))
            self.lines.append(f"| {system.name} | {len(runs)} | {bleu:.2f} | {' | '.join(cells)} |")
        self.lines.append("")

    def sweep(self, pair: str, references: list[str]) -> None:
        candidates = {
            system.name: statistics.mean(map(self.bleu, runs))
            for system in TABLES["main"]
            if system.name != REFERENCE_SYSTEM and (runs := self.runs_of(pair, system.name))
        }
        reference_runs = self.runs_of(pair, REFERENCE_SYSTEM)
        if not candidates or not reference_runs:
            return
        best = max(candidates, key=candidates.get)
        best_run = next((run for run in self.runs_of(pair, best) if run.seed == reference_runs[0].seed), None)
        if best_run is None:
            return
        gaps = ngram_sweep(self.hypotheses(best_run), self.hypotheses(reference_runs[0]), references)
        name, seed = f"results_{pair}_ngram_sweep.png", best_run.seed
        plot_ngram_sweep(gaps, self.docs / name, title=f"{best} − {REFERENCE_SYSTEM}, {pair}, seed {seed}")
        bleu_gaps = ", ".join(f"{gap:+.2f}" for _, gap in gaps["bleu"])
        self.lines += [
            "### n-gram sweep (paper 1 Fig. 4)",
            "",
            f"Best system by mean BLEU: `{best}`. Score gap to the {REFERENCE_SYSTEM} baseline as the n-gram order "
            f"grows (seed {seed}): BLEU n = 1..8: {bleu_gaps}.",
            "",
            f"![n-gram sweep]({name})",
            "",
        ]

    def pictures(self, pair: str) -> None:
        """What each main-table model learned about positions (first seed), drawn from its model folder when it
        is on this machine; a picture drawn earlier is kept otherwise."""
        pictures = []
        for system in TABLES["main"]:
            runs = self.runs_of(pair, system.name)
            if not runs:
                continue
            name = f"results_{pair}_{system.name}_positions.png"
            model_dir = runs[0].folder(self.args.models_dir)
            if (model_dir / "config.json").is_file():
                model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
                title = f"{system.name}, {pair}, seed {runs[0].seed}"
                if not plot_learned_positions(model, self.docs / name, title=title):
                    (self.docs / name).unlink(missing_ok=True)
            if (self.docs / name).is_file():
                pictures += [f"`{system.name}`:", "", f"![{system.name}]({name})", ""]
        if pictures:
            self.lines += ["### What the models learned about positions", "", *pictures]
