"""The harness of ``--rm-type code`` call and assert tests: runs inside the sandbox as ``/sandbox/main.py``.

Standard library only: the sandbox's interpreter runs this file as it is (it is never imported by slick).
Two processes, so that the program never holds the tests, the expected values or the report:

* the **harness** (this file, no arguments) first makes itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``:
  no other process of the sandbox user may read its memory, its ``/proc`` files or its file descriptors),
  then reads its spec (the program, the tests, a per-run key) from stdin to the end, keeps stdout for the
  report and points its own fd 1 at stderr, and starts the program's process;
* the **program's process** (this file with ``--serve``; stdin ``/dev/null``, stdout and stderr the
  harness's stderr) runs the program as ``__main__`` and then answers the harness's requests over two pipes:
  look up names, call, get an attribute, iterate. Values cross as data (:func:`encode`), rebuilt by the
  harness as exact builtin types (:func:`decode`); anything else stays in the program as an opaque handle
  that compares only by identity and has no truth value.

The tests run in the harness, with the program's functions as handles: ``f(1) == 2`` compares a plain int the
harness built with 2, so no ``__eq__`` of the program runs and nothing the test compares with reaches it
(builtins and standard modules a test uses as ``math.isclose`` are the harness's own, whatever the program
defines under those names). Each report line is ``HMAC-SHA256(key, json) json``, so the host drops any line
the program manages to write to the sandbox's stdout (bwrap's init holds it): it never sees the key.
"""
import ast
import builtins
import ctypes
import hmac
import importlib
import json
import linecache
import os
import signal
import subprocess
import sys
import time
import traceback

LINE_CAP = 16 << 20        # the largest answer the harness reads from the program
DEPTH_CAP = 200
BIG = 1 << 10000
PR_SET_DUMPABLE = 4
BEGIN, TEST, END = "begin", "test", "end"


# ---------------------------------------------------------------- values as data (both processes)

def encode(value, keep, depth=0):
    """``value`` as JSON data: None/bool/int/float/str as themselves, containers tagged (``["T", [...]]``...),
    subclasses of builtin types as their base type's value, anything else ``["R", id, type]`` via ``keep``."""
    t = type(value)
    if value is None or t is bool or t is str or t is float:
        return value
    if depth > DEPTH_CAP:
        return ["R", keep(value), t.__name__]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        v = int.__int__(value)
        return v if -BIG < v < BIG else ["I", format(v, "x")]
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        base = bytes if isinstance(value, bytes) else bytearray
        return ["B" if base is bytes else "BA", base.__getitem__(value, slice(None)).hex()]
    if isinstance(value, complex):
        return ["C", complex.__complex__(value).real, complex.__complex__(value).imag]
    for base, tag in ((list, "L"), (tuple, "T"), (set, "S"), (frozenset, "F")):
        if isinstance(value, base):
            return [tag, [encode(x, keep, depth + 1) for x in base.__iter__(value)]]
    if isinstance(value, dict):
        return ["D", [[encode(k, keep, depth + 1), encode(v, keep, depth + 1)] for k, v in dict.items(value)]]
    if t.__name__ == "module":
        return ["M", str(getattr(value, "__name__", "")), keep(value)]
    return ["R", keep(value), t.__name__]


class ProtocolError(Exception):
    """Data from the program that is not a value :func:`encode` makes."""


def decode(data, handle, depth=0):
    """The value of :func:`encode`'s ``data``, built only from exact builtin types; ``handle(id, type)`` (and
    ``handle(id, type, module)`` for modules) makes what stands for an opaque object."""
    t = type(data)
    if data is None or t in (bool, int, float, str):
        return data
    if t is not list or not data or type(data[0]) is not str or depth > DEPTH_CAP + 1:
        raise ProtocolError("not a value")
    tag, rest = data[0], data[1:]
    if tag in ("L", "T", "S", "F", "D") and (len(rest) != 1 or type(rest[0]) is not list):
        raise ProtocolError("bad container")
    if tag == "D":
        pairs = [p for p in rest[0] if type(p) is list and len(p) == 2]
        if len(pairs) != len(rest[0]):
            raise ProtocolError("bad dict")
        return {decode(k, handle, depth + 1): decode(v, handle, depth + 1) for k, v in pairs}
    make = {"L": list, "T": tuple, "S": set, "F": frozenset}.get(tag)
    if make is not None:
        return make(decode(x, handle, depth + 1) for x in rest[0])
    if tag in ("B", "BA") and len(rest) == 1 and type(rest[0]) is str:
        return (bytes if tag == "B" else bytearray).fromhex(rest[0])
    if tag == "I" and len(rest) == 1 and type(rest[0]) is str:
        return int(rest[0], 16)
    if tag == "C" and len(rest) == 2 and all(type(x) in (int, float) for x in rest):
        return complex(rest[0], rest[1])
    if tag == "R" and len(rest) == 2 and type(rest[0]) is int and type(rest[1]) is str:
        return handle(rest[0], rest[1])
    if tag == "M" and len(rest) == 2 and type(rest[0]) is str and type(rest[1]) is int:
        return handle(rest[1], "module", rest[0])
    raise ProtocolError("unknown value tag %r" % (tag,))


# ---------------------------------------------------------------- the program's process

def serve(rfd, wfd):
    """Run the program (its source is the first request), then answer requests until the pipe closes."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    rin, out = os.fdopen(rfd, "rb"), os.fdopen(wfd, "wb")
    objects = {}

    def keep(obj):
        objects[id(obj)] = obj
        return id(obj)

    def send(msg):
        out.write(json.dumps(msg).encode() + b"\n")
        out.flush()

    def value(data):
        return decode(data, lambda i, _t, _m=None: objects[i])

    source = json.loads(rin.readline())[1]
    linecache.cache["main.py"] = (len(source), None, source.splitlines(True), "main.py")
    scope = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(source, "main.py", "exec"), scope)
    except BaseException as e:
        send(["fail", type(e).__name__, str(e)[:1000], _tb_tail()])
        return
    send(["ready"])
    ops = {"names": lambda names: {n: encode(scope[n], keep) for n in names if n in scope},
           "call": lambda i, a, kw: objects[i](*[value(x) for x in a], **{k: value(v) for k, v in kw}),
           "getattr": lambda i, name: getattr(objects[i], name),
           "iter": lambda i: iter(objects[i]), "next": lambda i: next(objects[i]),
           "len": lambda i: len(objects[i]), "getitem": lambda i, k: objects[i][value(k)]}
    for line in rin:
        req = json.loads(line)
        try:
            result = ops[req[0]](*req[1:])
            send(["ok", result if req[0] == "names" else encode(result, keep)])
        except BaseException as e:
            send(["err", type(e).__name__, str(e)[:1000], _tb_tail()])


def _tb_tail():
    return "".join(traceback.format_exc(limit=-3).splitlines(True)[-4:])[-2000:]


# ---------------------------------------------------------------- the harness

class ProgramGone(BaseException):
    """The program's process ended or broke the protocol: no test can use it any more."""


class ProgramError(Exception):
    """The program raised an exception that is not a builtin one."""


class Link:
    """The harness's end of the pipes to the program's process; ``gone`` (why it cannot answer any more) and
    ``verdict`` (what that makes of a test) once it ended."""

    def __init__(self, proc, rin, out):
        self.proc, self.rin, self.out, self.gone, self.verdict = proc, rin, out, None, "runtime_error"

    def ask(self, msg):
        if self.gone:
            raise ProgramGone(self.gone)
        try:
            self.out.write(json.dumps(msg).encode() + b"\n")
            self.out.flush()
            line = self.rin.readline(LINE_CAP + 1)
            if not line.endswith(b"\n"):
                raise ProgramGone(self.end("answered more than %d MiB" % (LINE_CAP >> 20) if line else None))
            reply = json.loads(line)
            if type(reply) is not list or not reply or reply[0] not in ("ok", "err", "ready", "fail"):
                raise ProtocolError("not a reply")
        except (OSError, ValueError, RecursionError, ProtocolError) as e:
            raise ProgramGone(self.end("broke the harness protocol (%s)" % (e,)))
        if reply[0] == "fail":
            name = str(reply[1:2] and reply[1])
            exited = name in ("SystemExit", "KeyboardInterrupt")
            self.end("%s before its tests ran: %s: %s\n%s" % ("exited" if exited else "failed", name,
                                                            str(reply[2:3] and reply[2]),
                                                            "" if exited else str(reply[3:4] and reply[3])))
            self.verdict = "memory_limit" if name == "MemoryError" else "runtime_error"
            raise ProgramGone(self.gone)
        if reply[0] == "err":
            raise _program_exception(reply, msg[0] == "next")
        return reply[1] if len(reply) > 1 else None

    def value(self, data):
        try:
            return decode(data, lambda i, t, m=None: _module(m, i, t, self))
        except (ValueError, TypeError, RecursionError, ProtocolError) as e:
            raise ProgramGone(self.end("sent a bad value (%s)" % (e,)))

    def end(self, why):
        """Stop the program (``why``: what it did wrong; None: it ended by itself); the message."""
        code = None
        if self.proc is not None:
            try:
                if why:
                    self.proc.kill()
                code = self.proc.wait(2)
            except Exception:
                pass
        self.verdict = "runtime_error" if why else _exit_verdict(code)
        self.gone = "the program %s" % (why or "exited (%s)" % _how(code))
        return self.gone


def _how(code):
    return "exit code %s" % code if code is None or code >= 0 else "signal %s" % signal.Signals(-code).name


def _exit_verdict(code):
    return {-signal.SIGXCPU: "time_limit", -signal.SIGXFSZ: "output_limit",
            -signal.SIGKILL: "killed"}.get(code, "runtime_error")


def _program_exception(reply, iterating):
    """The program's exception as a builtin one of the same name (else :class:`ProgramError`); StopIteration
    only from ``next``: raised by a call it would end the test's ``map``/``all`` early and pass it."""
    name, message, tail = (reply + ["", "", ""])[1:4]
    cls = getattr(builtins, name, None) if type(name) is str else None
    stops = isinstance(cls, type) and issubclass(cls, (StopIteration, StopAsyncIteration))
    if not (isinstance(cls, type) and issubclass(cls, Exception)) or (stops and not iterating):
        cls = ProgramError
    return cls("%s (raised by the program: %s)\n%s" % (message, name, str(tail).rstrip()))


class Remote:
    """An object that stays in the program: callable, attributes, iteration, ``len`` and ``[]``; it compares
    by identity only and refuses a truth value, so nothing the tests compare reaches the program."""
    __slots__ = ("_id", "_type", "_link")

    def __init__(self, i, type_name, link):
        object.__setattr__(self, "_id", i)
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_link", link)

    def _ask(self, op, *args):
        return self._link.value(self._link.ask([op, self._id, *args]))

    def __call__(self, *args, **kwargs):
        return self._ask("call", [_arg(a) for a in args], [[k, _arg(v)] for k, v in kwargs.items()])

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __iter__(self):
        return self._ask("iter")

    def __next__(self):
        return self._ask("next")

    def __len__(self):
        return self._ask("len")

    def __getitem__(self, key):
        return self._ask("getitem", _arg(key))

    def __bool__(self):
        raise TypeError("a %s from the program has no truth value here; return a bool" % self._type)

    def __repr__(self):
        return "<program object of type %s>" % self._type


def _arg(value):
    def keep(obj):
        if type(obj) is Remote:
            return object.__getattribute__(obj, "_id")
        raise TypeError("a test passes a %s to the program; only data and the program's own objects can cross"
                        % type(obj).__name__)
    return encode(value, keep)


def _stdlib(name):
    names = getattr(sys, "stdlib_module_names", ())
    return bool(name) and name.split(".")[0] in names


def _module(name, i, type_name, link):
    """A module the program imported: the harness's own import when it is a standard one, else a handle."""
    if name is not None and _stdlib(name):
        __import__(name)
        return sys.modules[name]
    return Remote(i, type_name, link)


def _bindings(source):
    """The program's module-level names: ``{name: (module, attr)}`` for imports of a standard module (the
    harness makes them itself), ``{name: None}`` for what the program defines (def, class, assignment...)."""
    try:
        tree = ast.parse(source)
    except Exception:
        return {}
    found = {}

    def put(name, how):
        if found.get(name) is None or how is not None:
            found[name] = how if how is None or _stdlib(how[0]) else found.get(name)

    def visit(stmts):
        for node in stmts:
            if isinstance(node, ast.Import):
                for a in node.names:
                    put(a.asname or a.name.split(".")[0], (a.name if a.asname else a.name.split(".")[0], None))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for a in node.names:
                    if a.name != "*":
                        put(a.asname or a.name, (node.module, a.name))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                put(node.name, None)
            else:
                nested = [getattr(node, f, None) for f in ("body", "orelse", "finalbody")]
                nested += [h.body for h in getattr(node, "handlers", [])]
                nested = [b for b in nested if isinstance(b, list)]
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                        put(sub.id, None)
                    elif isinstance(sub, ast.ExceptHandler) and sub.name:
                        put(sub.name, None)
                for body in nested:
                    visit(body)
    visit(tree.body)
    return found


def _references(chunks):
    """(every name the tests use, the names they use as ``NAME.attr``)."""
    names, bases = set(), set()
    for source, _ in chunks:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                bases.add(node.value.id)
    return names, bases


def _own_import(module, attr):
    mod = importlib.import_module(module)
    if attr is None:
        return mod
    try:
        return getattr(mod, attr)
    except AttributeError:
        return importlib.import_module(module + "." + attr)


def test_globals(link, source, chunks):
    """The tests' globals: builtins stay builtins; the program's names as the program defines them, except
    imports of standard modules (and standard modules the tests use as ``NAME.attr``): the harness's own."""
    names, bases = _references(chunks)
    bound = _bindings(source)
    scope = {"__name__": "__test__", "__builtins__": builtins}
    ask = []
    for name in sorted(names):
        if hasattr(builtins, name):
            continue
        how = bound.get(name, False)
        try:
            if how:
                scope[name] = _own_import(*how)
            elif name in bases and _stdlib(name):
                scope[name] = _own_import(name, None)
            elif how is None:
                ask.append(name)
        except Exception:
            continue
    if ask:
        got = link.ask(["names", ask])
        if type(got) is not dict:
            raise ProgramGone(link.end("broke the harness protocol (names)"))
        for name in ask:
            if name in got:
                scope[name] = link.value(got[name])
    return scope


class Report:
    """Authenticated report lines on a descriptor only the harness holds."""

    def __init__(self, fd, key):
        self.fd, self.key = fd, key

    def line(self, *fields):
        body = json.dumps(list(fields))
        data = (hmac.new(self.key, body.encode(), "sha256").hexdigest() + " " + body + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]


def private():
    """Make this process non-dumpable (its memory, /proc files and descriptors closed to the program)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def start(source):
    """The program's process, with the program run (``link.gone`` says why not, when it did not get there)."""
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "--serve", str(req_r), str(resp_w)],
                            stdin=subprocess.DEVNULL, stdout=2, stderr=2, pass_fds=(req_r, resp_w))
    os.close(req_r)
    os.close(resp_w)
    link = Link(proc, os.fdopen(resp_r, "rb"), os.fdopen(req_w, "wb"))
    try:
        link.ask(["program", source])
    except ProgramGone:
        if "before its tests ran" not in link.gone:
            link.gone = link.gone.replace("the program exited", "the program exited before its tests ran", 1)
    return link


def _verdict(e, link):
    if isinstance(e, ProgramGone):
        return link.verdict, str(e)
    if isinstance(e, AssertionError):
        return "wrong_answer", traceback.format_exc(limit=-1)
    if isinstance(e, MemoryError):
        return "memory_limit", "MemoryError"
    return "runtime_error", traceback.format_exc(limit=-1)


def run_asserts(link, spec, report):
    chunks = spec["chunks"]
    codes = [compile(src, "<test>", "exec") for src, _ in chunks]
    try:
        scope = test_globals(link, spec["program"], chunks)
    except ProgramGone:
        scope = {}
    index = 0
    for code, (_, is_test) in zip(codes, chunks):
        t0 = time.perf_counter()
        try:
            if link.gone:
                raise ProgramGone(link.gone)
            exec(code, scope)
            verdict, error = "pass", None
        except BaseException as e:
            verdict, error = _verdict(e, link)
        if is_test:
            report.line(TEST, index, verdict, time.perf_counter() - t0, error)
            index += 1
    return index


def run_call(link, spec, report):
    t0 = time.perf_counter()
    got = None
    try:
        if link.gone:
            raise ProgramGone(link.gone)
        fn = test_globals(link, spec["program"], [(spec["fn_name"], True)]).get(spec["fn_name"])
        if fn is None:
            raise NameError("name %r is not defined by the program" % spec["fn_name"])
        got = json.loads(json.dumps(fn(*spec["args"]), default=repr))
        verdict, error = "ok", None
    except BaseException as e:
        verdict, error = _verdict(e, link)
    report.line(TEST, 0, verdict, time.perf_counter() - t0, error, got)
    return 1


def main():
    private()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    spec = json.loads(sys.stdin.buffer.read())
    report = Report(os.dup(1), bytes.fromhex(spec["key"]))
    os.dup2(2, 1)
    report.line(BEGIN)
    link = start(spec["program"])
    count = (run_call if spec["kind"] == "call" else run_asserts)(link, spec, report)
    report.line(END, count)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
