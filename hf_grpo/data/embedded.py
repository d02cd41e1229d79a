"""The datasets drawn in code, never downloaded: ``arithmetic`` (train and test), its held-out sets
(``arithmetic_transfer``, ``arithmetic_reasoning``), ``word_problems`` (train only) and ``word_problems_held_out``
(test only). ``load_embedded`` draws one split from the recipe's data keys and the seed.

    >>> from hf_grpo.data.embedded import embedded_splits
    >>> embedded_splits("word_problems"), embedded_splits("arithmetic")
    (['train'], ['train', 'test'])
"""

from __future__ import annotations

from datasets import Dataset

from . import arithmetic, word_problems


EMBEDDED = ("arithmetic", *arithmetic.HELD_OUT_SETS, "word_problems", "word_problems_held_out")


def embedded_splits(name: str) -> list[str]:
    """The splits of an embedded dataset: the held-out sets (``arithmetic_transfer``, ``arithmetic_reasoning``,
    ``word_problems_held_out``) have only ``test``, ``word_problems`` only ``train``."""
    if name == "word_problems":
        return ["train"]
    return ["test"] if name in (*arithmetic.HELD_OUT_SETS, "word_problems_held_out") else ["train", "test"]


def load_embedded(name: str, split: str, args, seed: int) -> Dataset:
    """One split of the embedded dataset ``name``, its size and shape from ``args`` (``DataArguments``: the
    ``arithmetic_*`` and ``word_problems_*`` keys); ``ValueError`` naming the splits it has."""
    if split not in embedded_splits(name):
        splits = " and ".join(repr(s) for s in embedded_splits(name))
        raise ValueError(f"dataset {name!r} has the split{'s' if ' and ' in splits else ''} {splits}, not {split!r}")
    if name in arithmetic.HELD_OUT_SETS:
        return Dataset.from_list(arithmetic.HELD_OUT_SETS[name](args.arithmetic_eval_size, seed))
    if name == "word_problems":
        steps, named, compare = (
            args.word_problems_max_steps,
            args.word_problems_named_lines,
            args.word_problems_compare,
        )
        return Dataset.from_list(word_problems.make_train(args.arithmetic_train_size, seed, steps, named, compare))
    if name == "word_problems_held_out":
        return Dataset.from_list(word_problems.make_held_out(args.arithmetic_eval_size, seed))
    size = args.arithmetic_train_size if split == "train" else args.arithmetic_eval_size
    return Dataset.from_list(arithmetic.make_split(split, size, seed, args.arithmetic_two_step_share))
