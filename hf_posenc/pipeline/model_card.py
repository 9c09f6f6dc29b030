"""Model cards: fill `model_cards/template.md` with a trained model's configuration and scores."""

from pathlib import Path

TEMPLATE = Path(__file__).with_name("model_card_template.md")

MULTI30K_NOTE = (
    "Multi30k task 1 (Elliott et al. 2016; 2017 for French): 29,000 training pairs of Flickr30K image "
    "descriptions; test set test_2016_flickr (1,000 pairs). For non-commercial research and education."
)

CITATIONS = {
    "marian": "Junczys-Dowmunt et al. 2018. Marian: Fast Neural Machine Translation in C++. ACL System Demonstrations.",
    "vaswani": "Vaswani et al. 2017. Attention Is All You Need. NeurIPS.",
    "posnet": "Zhang, Liu, Liu, Liang 2023. Interpreting Positional Information in Perspective of Word Order. ACL.",
    "gated": "Schmidt, Di Gangi 2023. Bridging the Gap between Position-Based and Content-Based Self-Attention "
    "for Neural Machine Translation. WMT.",
    "recurrent": "Chen, Wang, Utiyama, Sumita 2019. Recurrent Positional Embedding for Neural Machine Translation. "
    "EMNLP-IJCNLP.",
    "gehring": "Gehring et al. 2017. Convolutional Sequence to Sequence Learning. ICML.",
    "shaw": "Shaw, Uszkoreit, Vaswani 2018. Self-Attention with Relative Position Representations. NAACL.",
    "t5": "Raffel et al. 2020. Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer. JMLR.",
    "adaptive_t5": "Wu, Zhang, Mao, Chen 2021. On Scalar Embedding of Relative Positions in Attention Models. AAAI.",
    "alibi": "Press, Smith, Lewis 2022. Train Short, Test Long: Attention with Linear Biases. ICLR.",
    "rope": "Su et al. 2021. RoFormer: Enhanced Transformer with Rotary Position Embedding.",
    "lightconv": "Wu et al. 2019. Pay Less Attention with Lightweight and Dynamic Convolutions. ICLR.",
}

# module name -> (where its equations are, citation keys)
MODULE_SOURCES = {
    "none": ("no positional information (paper 1, Table 1)", ["posnet"]),
    "sinusoidal": (
        "sinusoidal absolute positions (Vaswani et al. 2017; paper 1 Eq. 6, SAPE)",
        ["vaswani", "posnet"],
    ),
    "learned": (
        "learned absolute positions (Gehring et al. 2017; paper 1 Eq. 6, LAPE)",
        ["gehring", "posnet"],
    ),
    "shaw": ("relative position representations, Shaw et al. 2018 Eq. 3-5", ["shaw"]),
    "t5_bias": ("bucketed relative bias, Raffel et al. 2020 §2.1", ["t5"]),
    "adaptive_t5": ("adaptive soft-bucketed relative bias, Wu et al. 2021", ["adaptive_t5"]),
    "alibi": ("attention with linear biases, Press et al. 2022", ["alibi"]),
    "rope": ("rotary position embedding, Su et al. 2021 Eq. 13-16", ["rope"]),
    "posnet_embed": ("PosNet-Embed, Zhang et al. 2023 Eq. 22/24", ["posnet"]),
    "posnet_attn": ("PosNet-Attn, Zhang et al. 2023 Eq. 20/23", ["posnet"]),
    "rpe_head": ("RPEHead, Chen et al. 2019 Eq. 6-8", ["recurrent"]),
    "mpr_head": ("MPRHead, Chen et al. 2019 Eq. 6, 9-11", ["recurrent"]),
    "attention": ("content attention, Vaswani et al. 2017", ["vaswani"]),
    "aposnet": ("aPosNet, Schmidt & Di Gangi 2023 Eq. 4, 8", ["gated"]),
    "rposnet": ("rPosNet, Schmidt & Di Gangi 2023 Eq. 4, 9-10", ["gated"]),
    "fourier": ("FourierNet, Schmidt & Di Gangi 2023 Eq. 11", ["gated"]),
    "gaussian": ("GaussianNet, Schmidt & Di Gangi 2023 Eq. 12", ["gated"]),
    "linear": ("LinearNet, Schmidt & Di Gangi 2023 Eq. 13", ["gated"]),
    "glinear": ("gLinearNet, Schmidt & Di Gangi 2023 Eq. 4, 13", ["gated"]),
    "lightconv": ("LightConv, Wu et al. 2019; Schmidt & Di Gangi 2023 Eq. 14", ["lightconv", "gated"]),
}

CHOICES = (
    "encoder_position_encoding",
    "decoder_position_encoding",
    "encoder_self_attention",
    "decoder_self_attention",
    "cross_attention",
)
DEFAULT_CHOICE = {"encoder_position_encoding": "sinusoidal", "decoder_position_encoding": "sinusoidal"}


def module_sources(choices: dict) -> tuple[str, str]:
    """Markdown lines naming each chosen module's paper and equations, and the deduplicated citations."""
    lines, keys = [], ["marian"]
    for name in dict.fromkeys(choices.values()):
        where, cited = MODULE_SOURCES[name]
        lines.append(f"- `{name}`: {where}")
        keys += [key for key in cited if key not in keys]
    return "\n".join(lines), "\n".join(f"- {CITATIONS[key]}" for key in keys)


def write_model_card(folder, model_config, scores: dict, **fields) -> Path:
    """Write README.md (YAML front matter with `model-index`, how to load, scores) into `folder`.

    Stock Marian configs lack the module fields: they are sinusoidal + content attention.
    """
    choices = {name: getattr(model_config, name, DEFAULT_CHOICE.get(name, "attention")) for name in CHOICES}
    sources, citations = module_sources(choices)
    values = {
        "dataset": "multi30k",
        "test_split": "test_2016_flickr",
        "data_note": MULTI30K_NOTE,
        "repo_or_folder": str(folder),
        "model_name": Path(folder).name,
        "bleu": scores["bleu"],
        "chrf": scores["chrf++"],
        "bleu_signature": scores["bleu_signature"],
        "chrf_signature": scores["chrf++_signature"],
        **choices,
        "module_sources": sources,
        "citation": citations,
        **fields,
    }
    path = Path(folder) / "README.md"
    path.write_text(TEMPLATE.read_text(encoding="utf-8").format_map(values), encoding="utf-8")
    return path
