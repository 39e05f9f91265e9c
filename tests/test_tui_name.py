"""Naming a model in the app (the command palette's "Name model A"): the store keeps the name, and the title bar, the
open view's title and the jump list call the model by it at once."""

from __future__ import annotations

import shutil

import pytest
from helpers.app import analysed_copy, make_app, settle, view_shown

from conftest import VIT
from vitsee.store import Store
from vitsee.tui.screens.jump import JumpScreen
from vitsee.tui.screens.name_model import NameModelScreen
from vitsee.tui.widgets.title_bar import TitleBar


@pytest.fixture
def store(tiny_store, tmp_path_factory, tmp_path):
    shared = analysed_copy(tiny_store, tmp_path_factory.getbasetemp())
    copy = tmp_path / "named" / "tiny.h5"
    shutil.copytree(shared.parent, copy.parent)  # the store and its folder of cached results, written to here
    return copy


async def test_a_name_given_in_the_app_is_kept_in_the_store_and_shown_everywhere_at_once(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(pilot, view_shown("cka"))
        screen = app.screen
        screen.action_name_model()
        await settle(pilot, lambda a: isinstance(a.screen, NameModelScreen))
        field = app.screen.query_one("#name-model-input")
        field.value = ""
        await pilot.press(*"My ViT", "enter")
        await settle(pilot, lambda a: "My ViT" in str(screen.query_one(TitleBar).render()))
        assert "My ViT" in screen.pane("cka").loaded.view.title  # the view already read, renamed in place
        screen.action_jump()
        await settle(pilot, lambda a: isinstance(a.screen, JumpScreen))
        assert any("My ViT" in target.what for target in app.screen.targets)
    with Store.open(store) as s:
        assert s.display_name(VIT) == "My ViT"
