"""Convolutional networks on npu: every convolution flavour, pooling, upsampling, embedding_bag and
batch norm are bitwise equal to CPU forward and backward (npu runs CPU's convolution path on the same
bytes), a small ResNet trains identically, and the SyncBatchNorm kernels compute batch norm's math."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import npudist  # noqa: F401


def _fwd_bwd_equal(module, x, dtype=torch.float32):
    torch.manual_seed(0)
    m_c = module.to(dtype)
    m_n = copy.deepcopy(m_c).npu()
    x_c = x.to(dtype).clone().requires_grad_(True)
    x_n = x.to(dtype).detach().npu().requires_grad_(True)
    out_c, out_n = m_c(x_c), m_n(x_n)
    assert out_n.device.type == "npu"
    assert torch.equal(out_c, out_n.cpu())
    g = torch.randn_like(out_c)
    out_c.backward(g)
    out_n.backward(g.npu())
    assert torch.equal(x_c.grad, x_n.grad.cpu())
    for (name, p_c), p_n in zip(m_c.named_parameters(), m_n.parameters()):
        assert torch.equal(p_c.grad, p_n.grad.cpu()), name


CONVS = {
    "conv1d": (lambda: nn.Conv1d(4, 6, 3), (2, 4, 10)),
    "conv1d_stride_dilation": (lambda: nn.Conv1d(4, 6, 3, stride=2, dilation=2, padding=2), (2, 4, 17)),
    "conv2d": (lambda: nn.Conv2d(3, 8, 3), (1, 3, 8, 8)),
    "conv2d_grouped_depthwise": (lambda: nn.Conv2d(4, 8, 3, groups=4, padding=1), (2, 4, 7, 7)),
    "conv2d_same_nobias": (lambda: nn.Conv2d(3, 5, (3, 2), padding="same", bias=False), (2, 3, 6, 7)),
    "conv2d_reflect": (lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), (2, 3, 6, 6)),
    "conv2d_replicate": (lambda: nn.Conv2d(3, 4, 3, padding=2, padding_mode="replicate"), (2, 3, 6, 6)),
    "conv2d_circular": (lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular"), (2, 3, 6, 6)),
    "conv3d": (lambda: nn.Conv3d(2, 3, 3, padding=1), (1, 2, 5, 5, 5)),
    "conv_transpose1d": (lambda: nn.ConvTranspose1d(4, 3, 3, stride=2, output_padding=1), (2, 4, 6)),
    "conv_transpose2d_grouped": (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2, dilation=2), (2, 4, 5, 5)),
    "conv_transpose3d": (lambda: nn.ConvTranspose3d(2, 3, 2, stride=2), (1, 2, 3, 3, 3)),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_convolution_bitwise_equal_cpu(name):
    make, shape = CONVS[name]
    torch.manual_seed(0)
    _fwd_bwd_equal(make(), torch.randn(shape))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_conv2d_other_dtypes(dtype):
    torch.manual_seed(0)
    _fwd_bwd_equal(nn.Conv2d(3, 8, 3, padding=1), torch.randn(2, 3, 8, 8), dtype)


def test_conv2d_channels_last():
    torch.manual_seed(0)
    m = nn.Conv2d(4, 8, 3, padding=1).to(memory_format=torch.channels_last)
    _fwd_bwd_equal(m, torch.randn(2, 4, 8, 8).contiguous(memory_format=torch.channels_last))


@pytest.mark.parametrize("layer,shape", [
    (lambda: nn.MaxPool2d(3, stride=2, padding=1), (2, 3, 9, 9)),
    (lambda: nn.AvgPool2d(2, ceil_mode=True), (2, 3, 7, 7)),
    (lambda: nn.AdaptiveAvgPool2d((3, 2)), (2, 3, 7, 5)),
    (lambda: nn.AdaptiveMaxPool1d(4), (2, 3, 9)),
    (lambda: nn.MaxPool3d(2), (1, 2, 4, 4, 4)),
    (lambda: nn.Upsample(scale_factor=2, mode="nearest"), (1, 2, 4, 4)),
    (lambda: nn.Upsample(scale_factor=1.5, mode="bilinear", align_corners=False), (1, 2, 4, 4)),
    (lambda: nn.Upsample(size=(5, 6, 7), mode="trilinear"), (1, 2, 3, 3, 3)),
    (lambda: nn.BatchNorm2d(3), (4, 3, 5, 5)),
    (lambda: nn.BatchNorm1d(3, affine=False), (6, 3)),
    (lambda: nn.GroupNorm(2, 4), (2, 4, 3, 3)),
    (lambda: nn.InstanceNorm2d(3, affine=True), (2, 3, 4, 4)),
])
def test_pooling_upsampling_norms_bitwise_equal_cpu(layer, shape):
    torch.manual_seed(0)
    _fwd_bwd_equal(layer(), torch.randn(shape))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_bitwise_equal_cpu(mode):
    torch.manual_seed(0)
    bag_c = nn.EmbeddingBag(10, 4, mode=mode)
    bag_n = copy.deepcopy(bag_c).npu()
    idx, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 3, 5])
    out_c, out_n = bag_c(idx, offsets), bag_n(idx.npu(), offsets.npu())
    assert torch.equal(out_c, out_n.cpu())
    out_c.sum().backward()
    out_n.sum().backward()
    assert torch.equal(bag_c.weight.grad, bag_n.weight.grad.cpu())


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.c1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c_out)
        self.c2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c_out)
        self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.down(x))


def small_resnet():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.MaxPool2d(2), BasicBlock(8, 16, 2), BasicBlock(16, 16, 1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def test_small_resnet_trains_bitwise_equal_cpu():
    torch.manual_seed(0)
    model = small_resnet()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(3)]
    results = {}
    for device in ("cpu", "npu"):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
        losses, grads = [], []
        for x, y in batches:
            opt.zero_grad()
            loss = F.cross_entropy(m(x.to(device)), y.to(device))
            loss.backward()
            losses.append(loss.detach().cpu())
            grads.append([p.grad.cpu() for p in m.parameters()])
            opt.step()
        results[device] = losses, grads, {k: v.cpu() for k, v in m.state_dict().items()}
    (l_c, g_c, s_c), (l_n, g_n, s_n) = results["cpu"], results["npu"]
    assert all(torch.equal(a, b) for a, b in zip(l_c, l_n)), (l_c, l_n)
    assert all(torch.equal(a, b) for step_c, step_n in zip(g_c, g_n) for a, b in zip(step_c, step_n))
    for k in s_c:  # weights and BatchNorm running statistics
        assert torch.equal(s_c[k], s_n[k]), k


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_syncbatchnorm_kernels_compute_batch_norm(dtype):
    """One 'rank' of SyncBatchNorm's kernel sequence equals batch norm in training mode (CPU autograd)."""
    torch.manual_seed(0)
    x = torch.randn(6, 3, 4, 5, dtype=torch.float64)
    w, b = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    gy = torch.randn_like(x)
    eps, momentum = 1e-5, 0.1
    xr, wr, br = (t.clone().requires_grad_(True) for t in (x, w, b))
    rm_ref, rv_ref = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    y_ref = F.batch_norm(xr, rm_ref, rv_ref, wr, br, training=True, momentum=momentum, eps=eps)
    y_ref.backward(gy)

    xn, wn, bn, gyn = (t.to(dtype).npu() for t in (x, w, b, gy))
    mean, invstd = torch.batch_norm_stats(xn, eps)
    n = x.numel() // 3
    # two "ranks" with the same statistics gather to the same mean / invstd; running stats see 2n values
    rm, rv = torch.zeros(3, device="npu", dtype=mean.dtype), torch.ones(3, device="npu", dtype=mean.dtype)
    counts = torch.tensor([n, n], dtype=mean.dtype, device="npu")
    g_mean, g_invstd = torch.batch_norm_gather_stats_with_counts(
        xn, torch.stack([mean, mean]), torch.stack([invstd, invstd]), rm, rv, momentum, eps, counts)
    y = torch.batch_norm_elemt(xn, wn, bn, g_mean, g_invstd, eps)
    sum_dy, sum_dy_xmu, gw, gb = torch.batch_norm_backward_reduce(gyn, xn, g_mean, g_invstd, wn, True, True, True)
    gx = torch.batch_norm_backward_elemt(gyn, xn, g_mean, g_invstd, wn, sum_dy, sum_dy_xmu,
                                         torch.tensor([n], dtype=torch.int32, device="npu"))
    assert y.device.type == "npu" and y.dtype == dtype and gx.dtype == dtype
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(y.cpu().double(), y_ref.detach(), **tol)
    torch.testing.assert_close(gx.cpu().double(), xr.grad, **tol)
    torch.testing.assert_close(gw.cpu().double(), wr.grad, **tol)
    torch.testing.assert_close(gb.cpu().double(), br.grad, **tol)
    unbiased = x.var(dim=(0, 2, 3), correction=1)
    torch.testing.assert_close(rm.cpu().double(), momentum * x.mean(dim=(0, 2, 3)), **tol)
    # 2n samples with the same per-channel statistics: unbiased variance var * 2n / (2n - 1)
    want_rv = (1 - momentum) + momentum * unbiased * (n - 1) / n * (2 * n) / (2 * n - 1)
    torch.testing.assert_close(rv.cpu().double(), want_rv, **tol)
