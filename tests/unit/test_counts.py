from exactpack.core.policies import compare_layouts, layout_counts
from exactpack.verify.fixture import DENSITY_LENGTHS, FIXTURE_DOCUMENTS, FIXTURE_MAX_LENGTH


def test_fixture_density_is_75_percent_in_both_layouts():
    lengths = [len(d) - 1 for d in FIXTURE_DOCUMENTS.values()]
    c = compare_layouts(lengths, FIXTURE_MAX_LENGTH)
    assert c["padded"]["cells"] == 12 and c["packed"]["cells"] == 12
    assert c["padded"]["valid_density"] == 0.75 == c["packed"]["valid_density"]
    assert c["packed"]["dense_scores_per_head"] == 2 * 6 * 6
    assert c["packed"]["semantic_edges"] == sum(n * (n + 1) // 2 for n in lengths)


def test_density_rises_to_100_percent_while_dense_scores_grow():
    c = compare_layouts(DENSITY_LENGTHS, FIXTURE_MAX_LENGTH)
    assert c["padded"]["valid_density"] == 0.75
    assert c["packed"]["valid_density"] == 1.0
    assert c["packed"]["dense_scores_per_head"] > c["padded"]["dense_scores_per_head"]
    assert c["packed"]["semantic_edges"] == c["padded"]["semantic_edges"]


def test_layout_counts_formulae():
    c = layout_counts(3, 5, [5, 1])
    assert (c["cells"], c["dense_scores_per_head"], c["semantic_edges"]) == (15, 75, 16)
