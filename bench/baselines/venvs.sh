#!/usr/bin/env bash
# Builds the side virtual environments holding the libraries that bench/ measures yogadl_plus
# against. They stay out of the project's own dependencies (their pins clash with ours and with
# each other), and the bench scripts run them as subprocesses.
#
#   usage: bash bench/baselines/venvs.sh .baselines    (the directory is git-ignored)
#
# Each venv is built once; delete its directory to rebuild it. Recipes known to work on
# Python 3.11:
#   yogadl     yogadl 0.1.4, the library this project grew from; runs with tensorflow-cpu 2.21.0.
#   petastorm  petastorm 0.13.1 needs pyarrow 14.0.2 (15 and later break make_batch_reader, 26
#              breaks the import), which in turn needs numpy<2 and pandas<3. Its image codec
#              needs an OpenCV built for numpy 1. torch goes in last: its setuptools pin
#              conflicts with petastorm's on paper only. make_reader datasets also need Spark and
#              Java, with PYSPARK_PYTHON pointing at this venv's python.
#   peers      grain + array-record, pylance (Lance) and litdata, with the CPU build of
#              torch 2.13.0 installed first so that litdata does not pull a CUDA build.
#              (mosaicml-streaming installs but does not import against this torch.)
#   images     bench_images' peers that share a torch: WebDataset's own loader and litdata
#              (optimize + StreamingDataset, also from S3 through boto3/obstore), CPU torch.
#   spdl       Meta's SPDL 0.8.0. spdl.io loads FFmpeg's shared libraries (4 to 9) at run time:
#              on Debian 12, `apt-get install libavdevice59 libavfilter8` (FFmpeg 5.1).
#   dali       NVIDIA DALI's CUDA 12 wheel from PyPI (2.4.0); it imports and runs CPU pipelines
#              (device_id=None) on a machine without a GPU, which is all bench_images uses.
#   megatron   megatron-core 0.16.1 (newest beside torch 2.13.0+cpu) for bench_tokens' index
#              build: its wheel ships the compiled index helper (megatron/core/datasets/
#              helpers_cpp), so nothing is built on first use; pybind11 is there for a source
#              build (`make -C .../megatron/core/datasets`) where a wheel lacks it. It imports
#              without Transformer Engine or Apex (warnings only); GPTDataset runs on the CPU.
#   ffcv       FFCV 1.0.2 (sdist only) builds a C extension against OpenCV and libjpeg-turbo
#              found through pkg-config: without `apt-get install libopencv-dev
#              libturbojpeg0-dev pkg-config` pip stops at "Could not find required package:
#              opencv". numpy<2 for its numba and compiled code.
# The image peers are tried one by one: one that does not install leaves its error's last
# lines in $DIR/<venv>.failed (bench_images reports them) and the others are still built.
set -eu
DIR=${1:-.baselines}
PYTHON=${PYTHON:-python3}
# The CPU build of torch: pip picks 2.13.0+cpu where a find-links directory holds it; elsewhere
# point PIP_EXTRA_INDEX_URL at PyTorch's CPU wheel index before running this script.
TORCH=${TORCH:-torch==2.13.0}
mkdir -p "$DIR"

new_venv() {  # new_venv NAME: true when NAME still has to be built (a fresh venv is made)
  if [ -x "$DIR/$1/bin/python" ] && [ -e "$DIR/$1/.complete" ]; then return 1; fi
  rm -rf "${DIR:?}/$1"
  "$PYTHON" -m venv "$DIR/$1"
}

# IMAGE_PEERS_ONLY=1 builds only the venvs bench_images uses (images, spdl, dali, ffcv) and
# megatron (bench_tokens).
if [ -z "${IMAGE_PEERS_ONLY:-}" ]; then
if new_venv yogadl; then
  "$DIR/yogadl/bin/pip" install -q tensorflow-cpu==2.21.0 yogadl==0.1.4
  touch "$DIR/yogadl/.complete"
fi

if new_venv petastorm; then
  "$DIR/petastorm/bin/pip" install -q petastorm==0.13.1 pyarrow==14.0.2 "numpy<2" "pandas<3" \
      "opencv-python-headless<4.11"
  "$DIR/petastorm/bin/pip" install -q "$TORCH" || echo "petastorm: torch not installed"
  touch "$DIR/petastorm/.complete"
fi

if new_venv peers; then
  "$DIR/peers/bin/pip" install -q "$TORCH"
  "$DIR/peers/bin/pip" install -q "$TORCH" grain array-record pylance litdata pyarrow numpy pillow
  touch "$DIR/peers/.complete"
fi
fi

# try_venv NAME PIP_ARGS...: builds venv NAME with one pip call per argument group (groups are
# separated by ";"), or records why it failed in $DIR/NAME.failed and goes on.
try_venv() {
  local name=$1; shift
  new_venv "$name" || return 0
  rm -f "$DIR/$name.failed"
  local group=() log="$DIR/$name.log"
  : > "$log"
  for arg in "$@" ";"; do
    if [ "$arg" != ";" ]; then group+=("$arg"); continue; fi
    if ! "$DIR/$name/bin/pip" install -q "${group[@]}" >> "$log" 2>&1; then
      { echo "pip install ${group[*]}:"; grep -E "ERROR|Error|error:" "$log" | tail -5; } \
          > "$DIR/$name.failed"
      echo "$name: not installed, see $DIR/$name.failed" >&2
      return 0
    fi
    group=()
  done
  touch "$DIR/$name/.complete"
}

try_venv images "$TORCH" ";" "$TORCH" pillow numpy webdataset litdata boto3 obstore
try_venv spdl spdl numpy pillow
try_venv dali nvidia-dali-cuda120 numpy pillow
try_venv megatron "$TORCH" ";" "$TORCH" megatron-core==0.16.1 pybind11 numpy
try_venv ffcv "$TORCH" ";" "$TORCH" "numpy<2" ffcv opencv-python-headless numba pillow

echo "yogadl:    $DIR/yogadl/bin/python"
echo "petastorm: $DIR/petastorm/bin/python"
echo "peers:     $DIR/peers/bin/python   (grain, array_record, lance, litdata, torch)"
for name in images spdl dali megatron ffcv; do
  if [ -e "$DIR/$name.failed" ]; then echo "$name: FAILED ($DIR/$name.failed)"
  else echo "$name: $DIR/$name/bin/python"; fi
done
