"""Export `vit_tiny.onnx`: torchvision's VisionTransformer at toy sizes (image 32, patch 8,
3 layers, 2 heads, hidden 16, MLP 32, 10 classes), with the export settings of
scripts/export_models.py (opset 17, no constant folding, so every Linear is a MatMul with the
Transpose of its weight; batch symbolic; initializers not graph inputs).

    /root/torchenv/bin/python onnx-models/gen_vit_tiny.py      # or any python with torch + onnx

Regression model of `tests/cli_compile.rs::vit_weight_transpose_*`: a stage replicated more
often than the stage that reads its `Transpose(W)`.
"""
import os

import onnx
import torch
from torchvision.models.vision_transformer import VisionTransformer

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vit_tiny.onnx")
torch.manual_seed(0)
m = VisionTransformer(image_size=32, patch_size=8, num_layers=3, num_heads=2, hidden_dim=16,
                      mlp_dim=32, num_classes=10)
with torch.no_grad():  # torchvision zero-initialises the head
    m.heads.head.weight.normal_(0.0, 0.02)
    m.heads.head.bias.normal_(0.0, 0.02)
m.eval()
torch.onnx.export(m, (torch.randn(2, 3, 32, 32),), out, dynamo=False, opset_version=17,
                  do_constant_folding=False, export_params=True, keep_initializers_as_inputs=True,
                  training=torch.onnx.TrainingMode.EVAL, input_names=["input"],
                  output_names=["logits"],
                  dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
mm = onnx.load(out)
inits = {i.name for i in mm.graph.initializer}
keep = [i for i in mm.graph.input if i.name not in inits]
del mm.graph.input[:]
mm.graph.input.extend(keep)
onnx.save_model(mm, out)
