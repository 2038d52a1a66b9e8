"""Issue 31, point 7: no guessing oracle and no weak secrets. A listener proves the key only
to a client that proved it first, so an outsider's exchange with it is the same whatever the
secret; a secret below 128 bits is refused with the command that makes a good one."""

from __future__ import annotations

import asyncio

import pytest

import pccl_aio as pccl
from pccl_aio import secret as secret_cli
from pccl_aio._wire import auth
from tests.helpers import FAST, OTHER_SECRET, SECRET


async def _outsider(port: int, guess: bytes) -> tuple[bytes, bytes, bytes]:
    """An outsider's whole exchange with a master, proving the key ``guess``: (its OPEN,
    every byte the master sent, the master's nonce)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        opening = auth.open_message(auth.ROLE_MASTER, 0, 0)
        writer.write(opening)
        challenge = await reader.readexactly(auth.CHALLENGE.size)
        status, nonce = auth.parse_challenge(challenge)
        assert status == auth.OK
        writer.write(auth.proof(guess, opening, nonce))
        rest = await asyncio.wait_for(reader.read(), 5)  # the verdict, then the close
        return opening, challenge + rest, nonce
    finally:
        writer.close()


async def test_an_outsider_gets_nothing_to_test_guesses_against():
    """Two masters with different secrets answer an outsider's guess with the same bytes (but
    for the fresh nonce): nothing the outsider receives depends on the secret, so no guess can
    be checked offline. Before the fix the CHALLENGE carried the master's HMAC of the key."""
    guess = auth.secret_key(secret_cli.make())  # a wrong key: neither master's
    answers = []
    for s in (SECRET, OTHER_SECRET):
        async with pccl.Master("127.0.0.1", 0, secret=s, **FAST) as master:
            opening, sent, nonce = await _outsider(master.port, guess)
            key = auth.secret_key(s)
            assert len(sent) == auth.CHALLENGE.size + auth.VERDICT.size  # then closed
            challenge, verdict = sent[:auth.CHALLENGE.size], sent[auth.CHALLENGE.size:]
            assert auth.check_verdict(key, opening, nonce, verdict) == (auth.REFUSED, auth.DIFFER)
            parsed = auth.parse_open(opening)
            assert parsed is not None
            server_mac = auth.verdict(key, parsed, nonce, auth.OK)[-32:]
            assert server_mac not in sent  # the master's proof never left it
            answers.append(challenge.replace(nonce, b"") + verdict)
    assert answers[0] == answers[1]


async def test_a_listener_that_accepts_without_proving_the_key_is_an_impostor():
    """A server that accepts any proof but cannot prove the key itself: the peer refuses it
    with an error that names the problem, and never sends it a frame."""
    received: list[bytes] = []

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opening = await reader.readexactly(auth.OPEN.size)
        writer.write(auth.CHALLENGE.pack(auth.MAGIC, auth.OK, bytes(auth.NONCE_SIZE)))
        await reader.readexactly(auth.PROOF.size)
        writer.write(auth.VERDICT.pack(auth.MAGIC, auth.OK, 0, bytes(32)))
        received.append(opening + await reader.read())
        writer.close()

    server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, pccl.Communicator(f"127.0.0.1:{port}", secret=SECRET, **FAST) as c:
        with pytest.raises(pccl.AuthenticationError, match="not this run's master"):
            await asyncio.wait_for(c.connect(attempts=1), 10)
    assert all(len(r) == auth.OPEN.size for r in received)  # no frame after the handshake


@pytest.mark.parametrize("weak", ["s3cret", "correcthorse77", "a" * 64, "4b109083344cbf26"])
async def test_a_weak_secret_is_refused_with_the_command_that_makes_one(weak):
    for make in (lambda: pccl.Master("127.0.0.1", 0, secret=weak),
                 lambda: pccl.Communicator("127.0.0.1:1", secret=weak)):
        with pytest.raises(pccl.InvalidUsageError, match=r"python -m pccl_aio\.secret") as err:
            make()
        assert "too weak" in str(err.value) and weak not in str(err.value)


def test_made_secrets_and_random_hex_of_128_bits_pass_the_check():
    for _ in range(100):
        auth.check_secret(secret_cli.make())
    auth.check_secret("5402c048d4e1cc1b9c73a80794304876")  # secrets.token_hex(16)
    assert auth.secret_bits("s3cret") < 40 < auth.secret_bits(secret_cli.make()) / 6
