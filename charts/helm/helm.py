"""The Python half of the `ballast-helm` crate: one Helm action per process.

The Rust side runs `python -c <this file>`, writes one JSON request to stdin and reads
one JSON reply from stdout: {"ok": <result>} or {"error": {"kind", "message"}}. The
actions are Helm's own, through helm-python-sdk (Helm's Go SDK, `libhelm_c.so`, loaded
with ctypes). Nothing here interprets a chart; it only moves data between Helm and Rust:
values arrive as YAML text and are read by Helm's YAML reader, rendered manifests are
split into documents and each document is read by that same reader, so what Rust sees
is what Helm would send to the API server.
"""

import json
import os
import sys

# The reply goes to a private copy of stdout; anything Helm's Go code prints on fd 1
# lands on stderr instead of corrupting the reply.
_reply = os.fdopen(os.dup(1), "w", encoding="utf-8")
os.dup2(2, 1)
sys.stdout = sys.stderr


class Refused(Exception):
    """An error with the kind the Rust side maps to its own variant."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind
        self.message = message


try:
    import helm_python as helm
    from helm_python import _native
except ImportError as e:  # the Rust side reports which Python lacks it
    helm = None
    _IMPORT_ERROR = str(e)


# Helm's exception classes, by the kind the Rust side knows them as.
_KINDS = {
    "HelmValuesError": "values",
    "HelmRenderError": "render",
    "HelmChartLoadError": "chart",
    "HelmChartInvalidError": "chart",
    "HelmKubeError": "kube",
    "HelmReleaseError": "release",
    "HelmStorageError": "release",
    "HelmNotFoundError": "not_found",
    "HelmInvalidArgError": "invalid_argument",
}


def _kind_of(error):
    return _KINDS.get(type(error).__name__, "helm:" + type(error).__name__)


def _values(text):
    """The values YAML, read as `helm install -f` reads it."""
    try:
        return helm.values_from_yaml(text)
    except helm.HelmError as e:
        raise Refused("values_yaml", str(e)) from None


def _validate(chart, values):
    """values.schema.json against the chart's defaults coalesced with `values`."""
    try:
        chart.validate_schema(values)
    except helm.HelmValuesError as e:
        raise Refused("schema", str(e)) from None


def _is_separator(line):
    return line == "---" or line.startswith("--- ") or line.startswith("---\t")


def _meaningful(lines):
    return any(l.strip() and not l.lstrip().startswith("#") for l in lines)


def _documents(source, text):
    """`text` split at its `---` lines; documents of only blanks and comments dropped."""
    docs, current = [], []
    for line in text.split("\n"):
        if _is_separator(line.rstrip()):
            docs.append(current)
            current = []
        else:
            current.append(line)
    docs.append(current)
    out = []
    for lines in docs:
        if not _meaningful(lines):
            continue
        content = "\n".join(lines).strip("\n") + "\n"
        doc = {"source": source, "content": content}
        try:
            doc["object"] = helm.values_from_yaml(content)
        except helm.HelmError as e:
            doc["error"] = str(e)
        out.append(doc)
    return out


def _load(path):
    return helm.Chart.load(path)


def op_check(_req):
    from importlib import metadata

    return {
        "package": metadata.version("helm-python-sdk"),
        "helm": helm.helm_sdk_version(),
        "helm_c": helm.helm_c_version(),
    }


def op_render(req):
    values = _values(req["values"])
    with _load(req["chart"]) as chart:
        _validate(chart, values)
        opts = {"name": req["release"], "namespace": req["namespace"]}
        if req.get("api_versions"):
            opts["api_versions"] = req["api_versions"]
        if req.get("kube_version"):
            opts["kube_version"] = req["kube_version"]
        # Chart.render() takes neither api_versions nor kube_version; the C ABI does.
        manifests = json.loads(
            _native.call_string(
                "helm_render", chart._raw(), json.dumps(values), json.dumps(opts)
            )
        )
        documents, notes = [], ""
        for source in sorted(manifests):
            if source.endswith("/NOTES.txt"):
                # The chart's own notes (<chart>/templates/NOTES.txt); Helm does not
                # show a subchart's either.
                parts = source.split("/")
                if len(parts) == 3 and parts[1] == "templates":
                    notes = manifests[source]
                continue
            documents.extend(_documents(source, manifests[source]))
        crds = []
        for crd in chart.crds:
            crds.extend(_documents(crd["filename"], crd["data"]))
        return {"crds": crds, "documents": documents, "notes": notes}


def op_values(req):
    values = _values(req["values"])
    with _load(req["chart"]) as chart:
        return chart.merge_values(values)


def op_validate(req):
    values = _values(req["values"])
    with _load(req["chart"]) as chart:
        _validate(chart, values)
    return None


def op_lint(req):
    values = _values(req["values"])
    return helm.lint(req["chart"], values, strict=req["strict"])


def _config(req):
    return helm.Config(kubeconfig_path=req["kubeconfig"], namespace=req["namespace"])


def _check_chart(req, values):
    # The schema is checked here first so that a violation is reported as one, not as
    # a failed install; Helm checks it again itself.
    with _load(req["chart"]) as chart:
        _validate(chart, values)


def op_install(req):
    values = _values(req["values"])
    _check_chart(req, values)
    o = req["options"]
    with _config(req) as cfg:
        return cfg.install(
            req["chart"],
            req["release"],
            values,
            namespace=req["namespace"],
            timeout=o.get("timeout_seconds"),
            wait=o["wait"],
            dry_run="client" if o["dry_run"] else None,
            create_namespace=o["create_namespace"],
            rollback_on_failure=o["rollback_on_failure"],
        )


def op_upgrade(req):
    values = _values(req["values"])
    _check_chart(req, values)
    o = req["options"]
    with _config(req) as cfg:
        return cfg.upgrade(
            req["chart"],
            req["release"],
            values,
            namespace=req["namespace"],
            timeout=o.get("timeout_seconds"),
            wait=o["wait"],
            dry_run="client" if o["dry_run"] else None,
            reset_values=o["reset_values"],
            rollback_on_failure=o["rollback_on_failure"],
        )


def op_uninstall(req):
    o = req["options"]
    with _config(req) as cfg:
        cfg.uninstall(
            req["release"],
            timeout=o.get("timeout_seconds"),
            wait=o["wait"],
            ignore_not_found=o["ignore_not_found"],
        )
    return None


OPS = {
    "check": op_check,
    "render": op_render,
    "values": op_values,
    "validate": op_validate,
    "lint": op_lint,
    "install": op_install,
    "upgrade": op_upgrade,
    "uninstall": op_uninstall,
}


def main():
    try:
        if helm is None:
            raise Refused("no_sdk", _IMPORT_ERROR)
        request = json.load(sys.stdin)
        op = OPS.get(request.get("op"))
        if op is None:
            raise Refused("protocol", "unknown op %r" % request.get("op"))
        reply = {"ok": op(request)}
    except Refused as e:
        reply = {"error": {"kind": e.kind, "message": e.message}}
    except Exception as e:  # noqa: BLE001 - every failure goes back as data
        if helm is not None and isinstance(e, helm.HelmError):
            reply = {"error": {"kind": _kind_of(e), "message": str(e)}}
        else:
            reply = {"error": {"kind": "python", "message": "%s: %s" % (type(e).__name__, e)}}
    json.dump(reply, _reply)
    _reply.write("\n")
    _reply.flush()


main()
