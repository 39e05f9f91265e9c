"""What a newcomer meets on the command line (issue 13): a way out named in each message, output that survives a
pipe, degenerate random inits said where they show, and a cached store read without torch."""

from __future__ import annotations

from conftest import run_cli

OTHER = "mobilenetv3_small_050"  # outside the ViT/ResNet/Mixer/Swin families: no blocks or sublayers defined


def test_layers_of_a_model_outside_the_families_lists_its_module_paths_and_says_so(capsys):
    import timm

    code, out, err = run_cli(["layers", OTHER, "--img-size", "64"], capsys)
    assert code == 0, err
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    model = timm.create_model(OTHER, pretrained=False)
    assert names == [n for n, _ in model.named_modules() if n]
    assert "--granularity modules" in err and "\n" not in err.strip()


def test_asking_such_a_model_for_sublayers_names_the_option_that_works(capsys):
    code, out, err = run_cli(["layers", OTHER, "--img-size", "64", "--granularity", "sublayers"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and "`vitsee layers MODEL --granularity modules`" in err
    code, _, err = run_cli(["layers", OTHER, "--granularity", "layer"], capsys)
    assert code == 2 and "--granularity 'layer'" in err and "blocks, sublayers, modules" in err
