"""Readiness and liveness probe of a feedline dispatcher or worker: GETs a path of its status
server and exits 0 on HTTP 200, else 1 with the reason on stderr.

    python /etc/feedline/probe/probe.py http://127.0.0.1:8080/metrics [--max-heartbeat-age S]

The status server asks for the service token (``$FEEDLINE_SERVICE_TOKEN``, sent as
``Authorization: Bearer``), and with ``$FEEDLINE_TLS_CERT`` it speaks HTTPS, with a CA
(``$FEEDLINE_TLS_CA``) requiring a client certificate: an ``httpGet`` probe of the kubelet can do
neither, so the probe is this command, which reads the container's own environment. The
certificate is verified against the CA, not against the host name (the probe calls its own pod on
127.0.0.1). ``--max-heartbeat-age S`` also fails when ``feedline_worker_seconds_since_heartbeat``
is above S or -1 (never): a worker that cannot reach its dispatcher is not ready for consumers.
"""

import os
import ssl
import sys
import urllib.request


def main(argv):
    url, max_age = argv[0], None
    if argv[1:2] == ["--max-heartbeat-age"]:
        max_age = float(argv[2])
    request = urllib.request.Request(url)
    token = os.environ.get("FEEDLINE_SERVICE_TOKEN", "").strip()
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context(cafile=os.environ.get("FEEDLINE_TLS_CA") or None)
        context.check_hostname = False
        if not os.environ.get("FEEDLINE_TLS_CA"):
            context.verify_mode = ssl.CERT_NONE
        if os.environ.get("FEEDLINE_TLS_CERT"):
            context.load_cert_chain(os.environ["FEEDLINE_TLS_CERT"], os.environ["FEEDLINE_TLS_KEY"])
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            body = response.read().decode("utf-8", "replace")
    except Exception as error:
        print(f"probe {url}: {error}", file=sys.stderr)
        return 1
    if max_age is not None:
        for line in body.splitlines():
            if line.startswith("feedline_worker_seconds_since_heartbeat "):
                age = float(line.split()[1])
                if age < 0 or age > max_age:  # -1: never answered
                    print(f"probe: last heartbeat {age:.1f} s ago (> {max_age})", file=sys.stderr)
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
