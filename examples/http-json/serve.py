#!/usr/bin/env python3
"""A small JSON health endpoint for the http-json tests, on 127.0.0.1 only.

    serve.py PORTFILE     binds 127.0.0.1:0, writes the port to PORTFILE, serves until killed

/health -> {"status": "ok", "checks": {"db": "up"}}; /down -> {"status": "down"};
/slow -> /health's answer after 300 ms; /notjson -> HTML; anything else 404."""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROUTES = {
    "/health": (200, {"status": "ok", "checks": {"db": "up"}}, 0),
    "/down": (503, {"status": "down"}, 0),
    "/degraded": (200, {"status": "degraded"}, 0),
    "/slow": (200, {"status": "ok", "checks": {"db": "up"}}, 0.3),
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        status, doc, delay = ROUTES.get(self.path, (404, {"error": "not found"}, 0))
        time.sleep(delay)
        body = json.dumps(doc).encode()
        if self.path == "/notjson":
            status, body = 200, b"<html>ok</html>"
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(sys.argv[1], "w") as f:
        f.write(str(server.server_address[1]))
    server.serve_forever()
