"""Every model: its parameter count in closed form, and a forward/backward pass on CPU."""

from __future__ import annotations

import pytest
import torch

from fedsim.models import MODELS, make_model, num_parameters


def _lstm_params(inp: int, hidden: int) -> int:
    return 4 * hidden * (inp + hidden) + 2 * 4 * hidden  # torch: weight_ih, weight_hh, b_ih, b_hh


def _conv(cin: int, cout: int, k: int, bias: bool = True) -> int:
    return cin * cout * k * k + (cout if bias else 0)


def _resnet18_gn(channels: int, classes: int) -> int:
    gn = lambda c: 2 * c
    total = _conv(channels, 64, 3, bias=False) + gn(64)
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for b in range(2):
            first_in = cin if b == 0 else cout
            total += _conv(first_in, cout, 3, False) + gn(cout) + _conv(cout, cout, 3, False) + gn(cout)
            if b == 0 and (stride != 1 or cin != cout):
                total += _conv(cin, cout, 1, False) + gn(cout)
        cin = cout
    return total + 512 * classes + classes


FEMNIST = {"channels": 1, "size": 28, "num_classes": 62}
CIFAR = {"channels": 3, "size": 32, "num_classes": 100}


@pytest.mark.parametrize(
    "name,dims,expected",
    [
        (
            "so_nwp_lstm",
            {"num_classes": 10004},
            10004 * 96 + _lstm_params(96, 670) + (670 * 96 + 96) + (96 * 10004 + 10004),
        ),
        (
            "so_nwp_lstm_small",
            {"num_classes": 10004},
            10004 * 16 + _lstm_params(16, 64) + (64 * 16 + 16) + (16 * 10004 + 10004),
        ),
        ("so_tag_logreg", {"in_features": 10000, "out_features": 500}, 10000 * 500 + 500),
        (
            "shakespeare_lstm",
            {"vocab_size": 90},
            90 * 8 + _lstm_params(8, 256) + _lstm_params(256, 256) + 256 * 90 + 90,
        ),
        (
            "shakespeare_lstm_small",
            {"vocab_size": 90},
            90 * 8 + _lstm_params(8, 64) + _lstm_params(64, 64) + 64 * 90 + 90,
        ),
        ("femnist_cnn", FEMNIST, _conv(1, 32, 5) + _conv(32, 64, 5) + (64 * 7 * 7 * 2048 + 2048) + (2048 * 62 + 62)),
        ("femnist_cnn_small", FEMNIST, _conv(1, 16, 5) + _conv(16, 32, 5) + (32 * 7 * 7 * 128 + 128) + (128 * 62 + 62)),
        ("cifar_cnn_small", CIFAR, _conv(3, 32, 3) + _conv(32, 64, 3) + (64 * 8 * 8 * 256 + 256) + (256 * 100 + 100)),
        ("cifar_resnet18_gn", CIFAR, _resnet18_gn(3, 100)),
        ("logreg", {"in_features": 64, "num_classes": 10}, 64 * 10 + 10),
    ],
)
def test_model_parameter_counts_and_a_cpu_forward_backward(name, dims, expected):
    model = make_model(name, dims, seed=1)
    assert num_parameters(model) == expected
    if name == "so_nwp_lstm":
        assert expected == 4_053_428  # TFF's Keras count (one LSTM bias) is 4,050,748
    if "channels" in dims:
        x = torch.randn(3, dims["channels"], dims["size"], dims["size"])
        out = model(x)
        assert out.shape == (3, dims["num_classes"])
        loss = torch.nn.functional.cross_entropy(out, torch.tensor([0, 1, 2]))
    elif "num_classes" in dims and "in_features" in dims:
        x = torch.randn(3, dims["in_features"])
        out = model(x)
        assert out.shape == (3, dims["num_classes"])
        loss = torch.nn.functional.cross_entropy(out, torch.tensor([0, 1, 2]))
    elif "in_features" in dims:
        x = torch.rand(3, dims["in_features"])
        target = torch.zeros(3, dims["out_features"])
        target[:, 0] = 1
        out = model(x)
        assert out.shape == (3, dims["out_features"])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out, target)
    else:
        classes = dims.get("num_classes", dims.get("vocab_size"))
        x = torch.randint(1, classes, (3, 7))
        out = model(x)
        if "num_classes" in dims:
            assert out.shape == (3, 7, classes)
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, classes), x.reshape(-1))
        else:
            assert out.shape == (3, classes)
            loss = torch.nn.functional.cross_entropy(out, x[:, 0])
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    torch.testing.assert_close(next(make_model(name, dims, seed=1).parameters()), next(model.parameters()))


def test_every_model_is_covered_and_refuses_the_wrong_dims():
    covered = {
        "so_nwp_lstm",
        "so_nwp_lstm_small",
        "so_tag_logreg",
        "shakespeare_lstm",
        "shakespeare_lstm_small",
        "femnist_cnn",
        "femnist_cnn_small",
        "cifar_cnn_small",
        "cifar_resnet18_gn",
        "logreg",
    }
    assert set(MODELS) == covered
    from fedsim.errors import FedsimError

    with pytest.raises(FedsimError, match="is a 'femnist' model"):
        make_model("femnist_cnn", {"vocab_size": 90})
