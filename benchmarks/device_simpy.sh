# Sourced by the device scripts (benchmarks/*_device.sh, tier_fidelity.sh) after PYTHONPATH is set:
# where the GPU machine lacks simpy, install the carried wheel (.whl/ or runs/fidelity/whl/) into
# /tmp/site and put it on PYTHONPATH.
if ! python -c "import simpy" 2>/dev/null; then
  python -m pip install -q --no-index --no-deps --target /tmp/site $(ls .whl/simpy-*.whl runs/fidelity/whl/simpy-*.whl 2>/dev/null | head -1) \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
