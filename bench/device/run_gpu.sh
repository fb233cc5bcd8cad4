#!/bin/bash
# Device side of issue #38 item 5: stash the onnxruntime-gpu pieces in /tmp/g across calls,
# then (run) assemble them, build the C extensions for this Python, and run bench_gpu.py.
G=/tmp/g; mkdir -p $G
cp .gpu/ortpart.* $G/ 2>/dev/null
ls -la $G | tail -6
[ "$1" = run ] || { nvidia-smi -L; python3 --version; exit 0; }
set -e
cp .gpu/w/*.whl .gpu/src.tar.xz $G/
cd $G
rm -rf site src && mkdir -p site src
cat ortpart.* > ort.bin
head -c 17701132 ort.bin | tar -xJf - -C site
tail -c +17701133 ort.bin | xz -T8 -dc > site/onnxruntime/capi/libonnxruntime_providers_cuda.so
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target site ./*.whl
tar -xJf src.tar.xz -C src
PY=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
SUF=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
for c in src/server/lmserve/server/backends/ngram/_kernel.c src/server/lmserve/server/backends/ngram/_arpa_import.c src/server/lmserve/server/text/_wordindex.c src/server/lmserve/server/decoding/_draw.c src/server/lmserve/server/worker/replies/_wire.c; do
  cc -O3 -fPIC -shared -std=c11 -fno-strict-aliasing -fno-trapping-math -I$PY $c -o ${c%.c}$SUF
done
export PYTHONPATH=$G/site:$G/src/server:$G/src/client:$G/src/export:$G/src/proto
export PYTHONUNBUFFERED=1
python3 -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())"
cd $G/src/bench
timeout ${BENCH_TIMEOUT:-420} python3 bench_gpu.py --work $G/work "${@:2}" 2>&1 | grep -v -i warn | tail -60
