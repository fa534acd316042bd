"""Issue 67: files, folders and values a user or a neighbour may hand freespec on purpose or by accident.

Planted symlinks in shared folders, builds killed by SIGKILL, bad records, one huge paragraph, control
characters in files a command prints, and booleans where a number is wanted."""
from __future__ import annotations

import types
import typing

import pytest

from freespec.proposers.registry import available_plugins, load_proposer_class


# --------------------------------------------------------------------------- booleans are not numbers


def _number_field(annotation) -> bool:
    """``int``/``float`` and their optional forms (the test's own reading of an annotation)."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _number_field(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return all(_number_field(a) for a in args)
    return annotation in (int, float)


def _numeric_fields():
    for plugin in sorted(available_plugins()):
        options = load_proposer_class(plugin).Options
        for name, field in options.model_fields.items():
            if _number_field(field.annotation):
                yield plugin, options, name


NUMERIC_FIELDS = list(_numeric_fields())


def test_every_plugin_has_numeric_options_to_check():
    assert {plugin for plugin, _, _ in NUMERIC_FIELDS} >= {"copy", "recycle", "retrieval", "hybrid"}


@pytest.mark.parametrize("plugin,options,name", NUMERIC_FIELDS, ids=[f"{p}.{n}" for p, _, n in NUMERIC_FIELDS])
@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_refused_where_a_number_is_wanted_naming_the_field(plugin, options, name, value):
    with pytest.raises(ValueError, match=f"{name}.*boolean is never taken as a number"):
        options.model_validate({name: value})


def test_a_boolean_inside_a_list_of_numbers_is_refused_and_real_booleans_still_pass():
    from freespec.proposers.recycle.proposer import RecycleOptions

    with pytest.raises(ValueError, match="tree_widths.*boolean"):
        RecycleOptions.model_validate({"tree_widths": [4, True]})
    bool_fields = [n for n, f in RecycleOptions.model_fields.items() if f.annotation is bool]
    assert bool_fields and RecycleOptions.model_validate({bool_fields[0]: True})
    assert typing.get_origin(RecycleOptions.model_fields["tree_widths"].annotation) is not None
