"""How far PyTorch's own CPU autocast (bf16) moves ResNet-20's gradients from
f32 at initialisation: the reference profile for tests/test_mixed.c's
tolerances (the same model and batch shape: random init, batch 16 at
32x32x3). Run: /usr/bin/python3 bench/torch_autocast_error.py
Prints the loss in both precisions and each conv / fc weight gradient's
relative error ||g_bf16 - g_f32|| / ||g_f32||."""
import sys, torch, copy
sys.path.insert(0, 'tests/fixtures')
import cifar_models as cm
torch.manual_seed(0)
m = cm.ResNet(20, 3, 10)
x = torch.randn(16,3,32,32); y = torch.tensor([(i*3+3)%10 for i in range(16)])
def grads(model, dtype):
    model.zero_grad()
    if dtype is None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
    else:
        with torch.autocast('cpu', dtype=dtype):
            out = model(x)
        loss = torch.nn.functional.cross_entropy(out.float(), y)
    loss.backward()
    return loss.item(), [(n, p.grad.clone()) for n,p in model.named_parameters()]
l0, g0 = grads(m, None)
l1, g1 = grads(m, torch.bfloat16)
print('loss', l0, l1)
for (n,a),(_,b) in zip(g0,g1):
    if 'conv' in n or 'fc' in n or 'shortcut.0' in n:
        print(n, float((a-b).norm()/a.norm()))
