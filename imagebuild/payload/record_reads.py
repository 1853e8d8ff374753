"""Which files importing some modules reads, on the image's own Python: `python3 record_reads.py MODULE...`.

Run inside an image by `--prefetch-import` (imagebuild/flows/prefetch.py), so eStargz layers put those files
first and a lazy consumer fetches them in one range when it mounts the layer. The files are those Python
opened (the `open` audit event, which every import of a .py or .pyc raises) and those the dynamic loader
mapped (/proc/self/maps: extension modules and the libraries they link), as real paths of regular files.
Prints one JSON object on its last line: {"imported": [...], "failed": {module: error}, "files": [...]}.
"""

import json
import os
import sys


def main(modules):
    opened = []

    def hook(event, args):
        if event == "open" and args:
            try:
                path = os.fsdecode(os.fspath(args[0]))
            except TypeError:  # a file descriptor
                return
            opened.append(os.path.abspath(path))

    sys.addaudithook(hook)
    imported, failed = [], {}
    for name in modules:
        try:
            __import__(name)
            imported.append(name)
        except BaseException as err:  # the host reports it; a prefetch list from a failed import means little
            failed[name] = "%s: %s" % (type(err).__name__, err)
    with open("/proc/self/maps") as maps:
        mapped = [line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6]
    files = set()
    for path in opened + [p for p in mapped if p.startswith("/")]:
        real = os.path.realpath(path.replace(" (deleted)", ""))
        if os.path.isfile(real) and not real.startswith(("/proc/", "/sys/", "/dev/")):
            files.add(real)
    print(json.dumps({"imported": imported, "failed": failed, "files": sorted(files)}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
