"""Hypothesis strategies shared by the tests: random documents, ranges, duplicates."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st

from exactpack import Binding, PackConfig, SequenceExample, Split, pack_examples

BINDING = Binding(266, "test-tokenizer", "sha256:test")


def scaled(n: int) -> int:
    """``n`` examples under the default profile (200), proportionally fewer under smaller
    ones (``HYPOTHESIS_PROFILE=mutation`` runs every test once per mutant), at least 5."""
    return max(5, n * settings.default.max_examples // 200)


@st.composite
def example_lists(draw, max_capacity: int = 12, max_examples: int = 10):
    """(examples, capacity): random docs, optional interior ranges, duplicates, masks."""
    capacity = draw(st.integers(1, max_capacity))
    n = draw(st.integers(1, max_examples))
    examples = []
    for i in range(n):
        if examples and draw(st.booleans()) and draw(st.booleans()):
            examples.append(examples[draw(st.integers(0, len(examples) - 1))])  # duplicate
            continue
        length = draw(st.integers(1, capacity))  # prediction pairs
        pre = draw(st.integers(0, 2))
        post = draw(st.integers(0, 2))
        doc = draw(
            st.lists(
                st.integers(0, 265),
                min_size=pre + length + 1 + post,
                max_size=pre + length + 1 + post,
            )
        )
        mask = draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=length, max_size=length)))
        examples.append(
            SequenceExample.from_document(
                doc,
                source_id=f"doc{i}",
                partition=Split.TRAIN,
                binding=BINDING,
                range=(pre, pre + length + 1),
                loss_mask=mask,
            )
        )
    return examples, capacity


@st.composite
def packed_epochs(draw, max_capacity: int = 12, max_examples: int = 10):
    examples, capacity = draw(example_lists(max_capacity, max_examples))
    rows = draw(st.integers(1, 4))
    epoch = pack_examples(Split.TRAIN, examples, BINDING, PackConfig(capacity, rows))
    return examples, capacity, epoch
