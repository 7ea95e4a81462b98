#!/usr/bin/env python3
"""make_tfevents_goldens.py: what TensorBoard reads from the event files
our writer (lua/fsdp/observe/tensorboard.lua) produces, for
tests/lua/tensorboard_spec.lua. Run once from the repository root after a
build, with the tensorboard package installed, and commit the outputs:

    python tests/golden/make_tfevents_goldens.py   # writes tests/golden/tensorboard/

It runs tests/golden/tensorboard/make.lua (two event files: a run truncated
by a resume and the resumed run), keeps the files, and records into
tests/golden/tensorboard/read.json what tensorboard's own readers make of
them: per file, every event (wall_time, step, file_version, each value's
tag and scalar or text) from EventFileLoader (which checks the CRCs), and
for the directory the scalar series of EventAccumulator (what the
dashboard draws: each step once).
"""
import glob
import json
import os
import subprocess

import tensorboard
from tensorboard.backend.event_processing import event_accumulator, event_file_loader
from tensorboard.util import tensor_util

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "tensorboard")
ROOT = os.path.dirname(os.path.dirname(HERE))


def number(x):
    x = float(x)
    return x if x == x and abs(x) != float("inf") else repr(x)


def main():
    for old in glob.glob(os.path.join(OUT, "events.out.tfevents.*")):
        os.remove(old)
    subprocess.run([os.path.join(ROOT, "build/bin/fsdp-lua"), os.path.join(OUT, "make.lua"), OUT], check=True)
    paths = sorted(glob.glob(os.path.join(OUT, "events.out.tfevents.*")))
    result = {"tensorboard": tensorboard.__version__, "files": {}, "scalars": {}, "texts": {}}
    for path in paths:
        events = []
        for e in event_file_loader.LegacyEventFileLoader(path).Load():
            rec = {"wall_time": e.wall_time, "step": e.step}
            if e.HasField("file_version"):
                rec["file_version"] = e.file_version
            values = []
            for v in e.summary.value:
                if v.HasField("simple_value"):
                    values.append({"tag": v.tag, "value": number(v.simple_value)})
                else:
                    values.append({"tag": v.tag, "plugin": v.metadata.plugin_data.plugin_name,
                                   "text": tensor_util.make_ndarray(v.tensor).item().decode("utf-8")})
            if values:
                rec["values"] = values
            events.append(rec)
        result["files"][os.path.basename(path)] = events
    acc = event_accumulator.EventAccumulator(OUT, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    for tag in sorted(acc.Tags()["scalars"]):
        result["scalars"][tag] = [[s.step, number(s.value)] for s in acc.Scalars(tag)]
    for tag in sorted(acc.Tags()["tensors"]):
        result["texts"][tag] = [[t.step, tensor_util.make_ndarray(t.tensor_proto).item().decode("utf-8")]
                                for t in acc.Tensors(tag)]
    with open(os.path.join(OUT, "read.json"), "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
