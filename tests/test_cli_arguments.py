"""The CLI's shared argument types."""
import argparse

import pytest

from freespec.cli.arguments import int_in


def test_int_in_accepts_the_range_and_digit_groups():
    assert int_in(2, 10)("2") == 2
    assert int_in(2, 10)("10") == 10
    assert int_in(1)("100_000") == 100_000


@pytest.mark.parametrize("parse, text, message", [
    (int_in(2, 10), "1", "must be between 2 and 10, not 1"),
    (int_in(2, 10), "11", "must be between 2 and 10, not 11"),
    (int_in(1), "0", "must be 1 or more, not 0"),
    (int_in(1), "1.5", "not an integer: '1.5'"),
])
def test_int_in_refuses_with_the_range(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse(text)


def test_a_subcommand_refuses_naming_the_option(capsys):
    from freespec.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--rounds", "0"])
    assert exit_info.value.code == 2
    assert "argument --rounds: must be 1 or more, not 0" in capsys.readouterr().err
