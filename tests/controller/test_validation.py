"""Unit tests of controller/validation.py's job tokens."""

from __future__ import annotations

from controller.validation import TOKEN_PREFIX, hash_token, new_token, token_matches


def test_tokens_never_read_as_command_line_options():
    # token_urlsafe alone starts with '-' about once in 64 tokens; argparse then takes
    # `--token -abc` for two options (a CI failure seen once)
    for _ in range(2000):
        token, digest = new_token()
        assert token.startswith(TOKEN_PREFIX) and not token.startswith("-")
        assert digest == hash_token(token) and token not in digest


def test_token_matches_only_its_own_hash():
    token, digest = new_token()
    other, _ = new_token()
    assert token != other
    assert token_matches(token, digest)
    assert not token_matches(other, digest)
    assert not token_matches(token[:-1], digest)
