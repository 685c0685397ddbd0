"""A dict subclass that also holds its items as attributes (diffusers' FrozenDict, a model's `config`):
the model reads the attribute (`self.config.center_input_sample`), and an attribute set after capture
leaves the item as it was (FrozenDict's own freeze check never fires), so the served graph differed from
eager by 0.75 on a UNet2DModel with no refusal. Its spelling, and the contents a later call compares,
hold the attributes that are not the item of the same key."""
from __future__ import annotations

from precompile.codegen.drivers.makefx_reads import _Contents, spelled


class MirroredConfig(dict):
    """As diffusers' FrozenDict: each item set as an attribute too."""

    def __init__(self, **items):
        super().__init__(**items)
        for name, value in items.items():
            setattr(self, name, value)


def test_an_attribute_mirroring_its_item_spells_as_the_items_alone():
    config = MirroredConfig(center=False, scale=1.0)
    assert spelled(config) == f"{__name__}.MirroredConfig({{'center': False, 'scale': 1.0}})"


def test_an_attribute_set_apart_from_its_item_is_a_change_spelled_and_compared():
    config = MirroredConfig(center=False, scale=1.0)
    before, contents = spelled(config), _Contents(config)
    config.center = True
    assert spelled(config) == f"{__name__}.MirroredConfig({{'center': False, 'scale': 1.0}}; attributes center=True)"
    assert spelled(config) != before and not contents.same(config)
    config.center, config.scale = False, float("1.0")  # equal to the items again, if other objects: spelled alike
    assert spelled(config) == before


def test_an_attribute_added_is_compared_by_a_later_call():
    config = MirroredConfig(scale=1.0)
    contents = _Contents(config)
    config.extra = 2
    assert not contents.same(config)
