"""--gpus all|N,M and --no-gpus on smoke and build: what reaches the flow, and which device nodes a buildah
container of some GPUs gets (device names as a host with two GPUs has them: mocked, no GPU here)."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.cli.options import gpu_request, gpus_chosen, gpus_options
from imagebuild.engine.buildah import gpu_devices


def parse(*argv):
    parser = argparse.ArgumentParser(exit_on_error=False)
    gpus_options(parser, "smoke-test")
    return parser.parse_args(argv)


def test_gpus_all_numbers_none_and_off():
    assert gpus_chosen(parse("--gpus", "all")) is True
    assert gpus_chosen(parse("--gpus", "1,0,1")) == ("1", "0")
    assert gpus_chosen(parse()) is None  # the flow decides: GPUs when this machine has them
    assert gpus_chosen(parse("--no-gpus")) is False


@pytest.mark.parametrize("text", ["", "any", "0,,1", "-1", "0;rm", "０"])
def test_a_bad_gpu_list_is_refused_naming_it(text):
    with pytest.raises(argparse.ArgumentTypeError, match="is not 'all' or GPU numbers"):
        gpu_request(text)


def test_gpus_and_no_gpus_together_are_refused():
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parse("--gpus", "all", "--no-gpus")


@given(st.text(max_size=20))
def test_any_text_is_a_request_or_one_clear_refusal(text):
    try:
        chosen = gpu_request(text)
    except argparse.ArgumentTypeError as error:
        assert repr(text) in str(error)
    else:
        assert chosen is True or (chosen and all(part.isdigit() for part in chosen))


HOST = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset", "/dev/nvidia-caps"]


def test_buildah_gets_the_chosen_gpus_and_every_shared_node():
    assert gpu_devices(True, HOST) == sorted(HOST)
    assert gpu_devices(("1",), HOST) == sorted(set(HOST) - {"/dev/nvidia0"})
    assert gpu_devices(False, HOST) == [] and gpu_devices(("0",), []) == []
