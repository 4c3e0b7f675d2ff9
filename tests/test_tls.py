"""TLS and mutual TLS for `ebb serve`, and its `health` action: answers over TLS equal the
plaintext server's on the same archive; under mutual TLS a client without a certificate is
refused, and so is any client that does not trust the server's CA; the token works over TLS;
`ebb health` exits 0 on a healthy server and 1 otherwise; a missing certificate file is a usage
error. The certificates (a CA, a server certificate for 127.0.0.1 and localhost, a client
certificate) are made here, with openssl if it is on PATH, else with the cryptography package."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.flight as flight
import pytest

from ebb.query.flight_client import FlightArchiveClient
from ebb.query.flight_server import ArchiveFlightServer, ServerTls
from ebb.storage.archive import Archive
from ebb.storage.errors import UsageError

from support import SCHEMA, config, ebb, random_rows, rows_multiset, table_of

TOKEN = "tls-token"


def _openssl(pki: Path) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=pki, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=ebb test CA")
    (pki / "server.ext").write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")
    for name, ext in (("server", ["-extfile", "server.ext"]), ("client", [])):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN=ebb test {name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", *ext)


def _cryptography(pki: Path) -> None:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.timezone.utc)

    def issue(cn: str, key, issuer, signer, ca: bool, san: list | None):
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
             .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(signer, hashes.SHA256())

    def save(name: str, key, cert) -> None:
        (pki / f"{name}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                            serialization.NoEncryption()))
        (pki / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ebb test CA")])
    save("ca", ca_key, issue("ebb test CA", ca_key, ca_name, ca_key, True, None))
    for name, san in (("server", [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                      ("client", None)):
        key = ec.generate_private_key(ec.SECP256R1())
        save(name, key, issue(f"ebb test {name}", key, ca_name, ca_key, False, san))


def make_pki(pki: Path) -> Path:
    """ca.pem, server.pem/.key (127.0.0.1, localhost) and client.pem/.key, signed by the CA."""
    pki.mkdir(parents=True, exist_ok=True)
    if shutil.which("openssl"):
        _openssl(pki)
        return pki
    try:
        import cryptography  # noqa: F401
    except ImportError:
        pytest.skip("neither openssl (on PATH) nor the cryptography package is here to make test certificates")
    _cryptography(pki)
    return pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory) -> Path:
    """A second, unrelated CA with its own client certificate."""
    return make_pki(tmp_path_factory.mktemp("other-pki"))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tls") / "arc")
    rng = np.random.default_rng(7)
    with Archive.create(path, config(mode="rebuild")) as arc:
        arc.load(table_of(random_rows(rng, 300, 1, 16, 16, 30, "b"), SCHEMA), 16)
        for T in (18, 20, 22):
            arc.load(table_of(random_rows(rng, 60, T - 1, T, 16, 30, f"u{T}-"), SCHEMA), T)
    return path


def _tls(pki: Path, mutual: bool) -> ServerTls:
    return ServerTls((pki / "server.pem").read_bytes(), (pki / "server.key").read_bytes(),
                     (pki / "ca.pem").read_bytes() if mutual else None)


def _answers(c: FlightArchiveClient) -> dict:
    return {"probes": [rows_multiset(c.probe(k)) for k in (0, 3, 11, 29, 99)],
            "range": rows_multiset(c.probe_range(5, 17)),
            "scan": rows_multiset(c.scan_table()),
            "scan_as_of": rows_multiset(c.scan_table(as_of=25)),
            "records": c.info()["records"]}


def test_tls_and_mutual_tls_answer_as_the_plaintext_server(built, pki):
    ca = (pki / "ca.pem").read_bytes()
    cert, key = (pki / "client.pem").read_bytes(), (pki / "client.key").read_bytes()
    with ArchiveFlightServer(built, port=0) as plain, \
            ArchiveFlightServer(built, port=0, tls=_tls(pki, False), token=TOKEN) as tls, \
            ArchiveFlightServer(built, port=0, tls=_tls(pki, True)) as mtls:
        assert tls.url.startswith("grpc+tls://127.0.0.1:") and plain.url.startswith("grpc://")
        with FlightArchiveClient(plain.url) as c:
            expected = _answers(c)
        assert expected["scan"] and expected["records"] > 0
        with FlightArchiveClient(tls.url, token=TOKEN, tls_root_certs=ca) as c:
            assert _answers(c) == expected
        with FlightArchiveClient(mtls.url, tls_root_certs=ca, cert_chain=cert, private_key=key) as c:
            assert _answers(c) == expected
        # the token is still required over TLS
        with FlightArchiveClient(tls.url, tls_root_certs=ca) as c, pytest.raises(flight.FlightUnauthenticatedError):
            c.probe(3)
        # HOST:PORT with TLS settings means grpc+tls; a grpc:// URL with them is refused, not sent in clear
        host_port = tls.url.removeprefix("grpc+tls://")
        with FlightArchiveClient(host_port, token=TOKEN, tls_root_certs=ca) as c:
            assert rows_multiset(c.probe(3)) == expected["probes"][1]
        with pytest.raises(UsageError, match="must be grpc\\+tls://"):
            FlightArchiveClient(f"grpc://{host_port}", tls_root_certs=ca)


def test_mutual_tls_refuses_a_client_without_a_certificate_or_without_the_ca(built, pki, other_ca):
    ca = (pki / "ca.pem").read_bytes()
    with ArchiveFlightServer(built, port=0, tls=_tls(pki, True)) as mtls, \
            ArchiveFlightServer(built, port=0, tls=_tls(pki, False)) as tls:
        refused = flight.FlightUnavailableError  # gRPC: the TLS handshake failed, so no connection
        with FlightArchiveClient(mtls.url, tls_root_certs=ca, timeout=10) as c, pytest.raises(refused):
            c.probe(3)  # no client certificate
        other_cert, other_key = (other_ca / "client.pem").read_bytes(), (other_ca / "client.key").read_bytes()
        with FlightArchiveClient(mtls.url, tls_root_certs=ca, cert_chain=other_cert, private_key=other_key,
                                 timeout=10) as c, pytest.raises(refused):
            c.probe(3)  # a certificate the server's client CA did not sign
        # a client that does not trust the server's CA is refused by its own side, with or without mTLS
        for server in (tls, mtls):
            with FlightArchiveClient(server.url, tls_root_certs=(other_ca / "ca.pem").read_bytes(),
                                     cert_chain=(pki / "client.pem").read_bytes(),
                                     private_key=(pki / "client.key").read_bytes(), timeout=10) as c, \
                    pytest.raises(refused):
                c.probe(3)
        # plaintext gRPC to a TLS port fails too
        with FlightArchiveClient(tls.url.replace("grpc+tls://", "grpc://"), timeout=10) as c, pytest.raises(refused):
            c.probe(3)


def test_health_action(built, tmp_path):
    path = str(tmp_path / "arc")
    shutil.copytree(built, path)
    # the writer opens the archive first: a process that reads it read-only cannot also write it
    with Archive(path) as arc, ArchiveFlightServer(path, port=0) as s, FlightArchiveClient(s.url) as c:
        assert [a.type for a in c._client.list_actions()] == ["health"]
        h = c.health()
        assert h["status"] == "ok" and "why" not in h, h
        assert h["archive"] == "arc" and h["update_seq"] == 4 and h["last_update_time"] == 22
        assert h["format_version"] == 2 and h["ebb_version"]
        assert 0 <= h["seconds_since_commit"] < 3600
        time.sleep(1.0)
        arc.load(table_of(random_rows(np.random.default_rng(3), 20, 23, 24, 16, 30, "n"), SCHEMA), 24)
        deadline = time.monotonic() + 5
        while (h := c.health())["served_update_seq"] != 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert h["status"] == "ok" and h["update_seq"] == h["served_update_seq"] == 5, h
        assert h["last_update_time"] == 24 and h["seconds_since_commit"] < 1.0, h
        with pytest.raises(flight.FlightServerError, match="read-only"):
            list(c._client.do_action(flight.Action("compact", b"")))


def _start_serve(path: str, *extra: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, "-m", "ebb.tools.cli", "serve", path, "--port", "0", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert "serving" in line, (line, p.stderr.read() if p.poll() is not None else "")
    return p, line.split(" at ")[1].split()[0]


def test_cli_serves_mutual_tls_probes_and_checks_health(built, pki, other_ca):
    tls = ["--tls-cert", pki / "server.pem", "--tls-key", pki / "server.key"]
    client = ["--tls-ca", pki / "ca.pem", "--tls-cert", pki / "client.pem", "--tls-key", pki / "client.key"]
    p, url = _start_serve(built, *map(str, tls), "--tls-client-ca", str(pki / "ca.pem"), "--token", TOKEN)
    try:
        assert url.startswith("grpc+tls://127.0.0.1:")
        local = ebb("probe", built, 3, "--format", "jsonl")
        remote = ebb("probe", "--server", url, 3, "--token", TOKEN, *client, "--format", "jsonl")
        assert remote.returncode == 0, remote.stderr
        assert sorted(remote.stdout.splitlines()) == sorted(local.stdout.splitlines()) and local.stdout

        h = ebb("health", "--server", url, "--token", TOKEN, *client)
        assert h.returncode == 0 and json.loads(h.stdout)["status"] == "ok", h.stderr
        h = ebb("health", "--server", url, "--token", TOKEN, *client, "--max-age", "0.001")
        assert h.returncode == 1 and json.loads(h.stdout)["status"] == "stale", h.stdout
        for bad in (["--tls-ca", pki / "ca.pem"],  # no client certificate
                    ["--tls-ca", other_ca / "ca.pem", *client[2:]]):  # does not trust the server's CA
            r = ebb("health", "--server", url, "--token", TOKEN, *bad, "--timeout", 10)
            assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
            assert r.stderr.startswith(f"ebb: error: {url}: unhealthy: "), r.stderr
        r = ebb("probe", "--server", url, 3, "--token", TOKEN, "--tls-ca", pki / "ca.pem")
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and err.strip().splitlines()[-1] == \
        "ebb: server stopped by SIGTERM (the running calls finished)", err
    r = ebb("health", "--server", url, *client)
    assert r.returncode == 1 and "unhealthy" in r.stderr


def test_missing_or_bad_certificate_files_are_usage_errors(built, pki, tmp_path):
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    cases = [
        (["serve", built, "--port", 0, "--tls-cert", tmp_path / "nope.pem", "--tls-key", pki / "server.key"],
         "--tls-cert", "No such file"),
        (["serve", built, "--port", 0, "--tls-cert", pki / "server.pem"], "--tls-key", "go together"),
        (["serve", built, "--port", 0, "--tls-client-ca", pki / "ca.pem"], "--tls-client-ca", "needs --tls-cert"),
        (["serve", built, "--port", 0, "--tls-cert", tmp_path / "junk.pem", "--tls-key", pki / "server.key"],
         "junk.pem", "not a PEM file"),
        (["probe", "--server", "127.0.0.1:1", 3, "--tls-ca", tmp_path / "nope.pem"], "--tls-ca", "No such file"),
        (["health", "--server", "grpc://127.0.0.1:1", "--tls-ca", pki / "ca.pem"], "grpc+tls://", "TLS certificates"),
    ]
    for args, *words in cases:
        r = ebb(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("ebb: error: "), (args, r.stderr)
        assert all(w in lines[0] for w in words), (args, lines[0])
