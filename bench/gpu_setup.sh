# Sourced at the start of every GPU call, from the repository root: install the carried wheels (the device
# machine has no registry) from $WHEELS (default .whl), unpack the carried model folders' .gz files, check the
# imports. bench/gpu_carry.sh builds .whl and .cache/gpu; a call carries both: [".whl", ".cache/gpu"].
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHEELS:-.whl}"/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
for packed in .cache/gpu/*/*.gz; do [ -e "$packed" ] && gunzip -kf "$packed"; done
python3 -c "import torch, transformers, canvasread.server.app, canvasread.cli, canvasread.canvas.engine.runner, canvasread.mcp.http; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
