"""What a measure of how alike two layers are declares, and the registry that finds it by name.

A measure is one module of measures/catalog/ with a subclass of `Measure` that sets `name`: its direct form (two
layers' features -> a float), its all-pairs form (the LayerGrams of many layers -> a layer x layer matrix), its
parameters (`Parameter`: keyword, default, check and help, declared once) and the words and figures its view
shows. Defining the class registers it; nothing else names it:

    the all-pairs dispatch and the image resampling   measures/grams.py pairwise, measures/resampling.py
    its `vitsee analyze --NAME` flag and options       analyses/similarity.py makes a GramMeasure of it
    `vitsee show`, export, the zoo, the app's `m`      the analysis's registry (engine/analyses/contract.py)

measures/README.md walks through adding one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from vitsee.errors import VitseeError


@dataclass(frozen=True)
class Parameter:
    """One parameter of a measure, declared once: the keyword its functions take, its default, its check and the help
    of its `vitsee analyze` option.

    name: the keyword of the measure's direct and all-pairs functions, and its key in a result's params (the cache
    key: renaming it would orphan cached results). option: the `vitsee analyze` option without its dashes
    (`knn-k` for --knn-k; its Python name knn_k follows), or "" for a parameter fixed at its default that the cache
    key records all the same. check(value, measure, n_images) returns the value to use or raises the VitseeError
    that names the bad value and the way out; it runs before any work. Measures that share a parameter (mknn and
    CKNNA's k) share one Parameter, so one option sets both.
    """

    name: str
    default: Any
    help: str = ""
    option: str = ""
    check: Callable[[Any, str, int], Any] | None = None
    # the default of a store's analysis where it differs from the direct function's (RBF CKA's HSIC: the store's is
    # the unbiased one, as its linear CKA's; the direct function gives Kornblith et al.'s, what other packages print)
    store_default: Any = None
    option_type: type | None = None  # the option's type where it is not the default's (a word that the check reads)
    shown_default: str = ""  # the store's default as the option's help says it (default: the value)

    @property
    def analysis_default(self) -> Any:
        """Returns the value a store's analysis uses when its option is not given."""
        return self.default if self.store_default is None else self.store_default

    @property
    def type(self) -> type:
        """Returns the type of the option's value (its default's, unless option_type says)."""
        return self.option_type or type(self.default)

    @property
    def option_help(self) -> str:
        """Returns the option's help with its default."""
        return f"{self.help} [default: {self.shown_default or self.analysis_default}]"

    def checked(self, value: Any, measure: str, n_images: int) -> Any:
        """Returns the value to use for `measure` on n_images images (the check's, or the value as given)."""
        return value if self.check is None else self.check(value, measure, n_images)


AT_N = "holds the value at this n, the mean over draws of as many images"


class Measure:
    """A measure of how alike two layers are (one module of measures/catalog/ each; see the module's docstring).

    A subclass that sets `name` is registered when it is defined. It gives `direct` and `pairwise` (as
    staticmethods: the functions, importable on their own), lists its `parameters`, and describes itself.
    """

    name: ClassVar[str] = ""  # its view strings NAME:A:B, its results' folder, `vitsee analyze --NAME`
    label: ClassVar[str] = ""  # its tab, legends and the words of its p-value (default: its name)
    title: ClassVar[str] = ""  # what it computes, in a line (its view's title)
    option_help: ClassVar[str] = ""  # the help of `vitsee analyze --NAME`
    order: ClassVar[int] = 100  # its place among the views and the app's `m` cycle (the measures: 11 ... 19)
    parameters: ClassVar[tuple[Parameter, ...]] = ()
    higher_is_similar: ClassVar[bool] = True  # False for a distance: small is alike, its null compared from above
    symmetric: ClassVar[bool] = True  # measure(x, y) == measure(y, x)
    alike: ClassVar[str] = "more alike"  # what a small p-value says of two layers
    value_name: ClassVar[str] = ""  # what a cell's value is, for legends (default: the label)
    value_range: ClassVar[tuple[float | None, float | None]] = (0.0, 1.0)  # the colour range (None: the data's)
    # how long all pairs of 23 layers took at n = 1000 on one busy CPU core (benchmarks/README.md "Measures beyond
    # linear CKA"), and whether the time grows as n^3 (a decomposition per pair) or as n^2: the slow-run warning
    seconds_at_1000: ClassVar[float] = 1.0
    cubic: ClassVar[bool] = False
    faster: ClassVar[str] = "--max-images fewer, a GPU"  # what shortens a slow run of it, in the warning's words
    # what its jackknife interval (--measure-bootstrap) holds, in the words of a caption (README, Statistics; measured
    # by benchmarks/coverage.py): the large-n value, or only the value at this n where the estimator is biased
    interval_holds: ClassVar[str] = AT_N
    own_view: ClassVar[bool] = True  # a layer x layer view of its own (False: linear CKA, whose view is cka.py's)

    @classmethod
    def seconds(cls, n: int, layers: int, **params) -> float:
        """Returns about how long all pairs of `layers` layers take over n images on one busy CPU core, from
        seconds_at_1000 (23 layers at n = 1,000) grown as n^3 or n^2 and as the pairs: the slow-run warnings."""
        return cls.seconds_at_1000 * (n / 1000) ** (3 if cls.cubic else 2) * (layers / 23) ** 2

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            REGISTRY.add(cls())

    @staticmethod
    def direct(x: Any, y: Any, **params) -> float:
        """Returns the measure of two layers' features x (n, ...) and y (n, ...) as a Python float."""
        raise NotImplementedError

    @staticmethod
    def pairwise(a: list, b: list, **params) -> Any:
        """Returns the (len(a), len(b)) numpy matrix of the measure between LayerGrams a (rows) and b (columns; b is a
        for a layer set against itself), with every parameter given by keyword (measures/grams.py pairwise checks
        the inputs and fills in the defaults)."""
        raise NotImplementedError

    def undefined(self, grams: Any) -> str:
        """Returns why the measure gives a layer (its LayerGrams, neither constant nor non-finite) no value, as a code
        the views put in words (analyses/similarity.py UNDEFINED), '' when it gives one: a measure with a condition
        of its own says so here (RSA: 'flat', RBF CKA: 'median')."""
        return ""

    @property
    def defaults(self) -> dict:
        """Returns {parameter: default}, in declared order: the direct and all-pairs functions' defaults."""
        return {p.name: p.default for p in self.parameters}

    @property
    def analysis_defaults(self) -> dict:
        """Returns {parameter: default} of a store's analysis (where a parameter's store_default differs)."""
        return {p.name: p.analysis_default for p in self.parameters}

    @property
    def significance(self) -> str:
        """Returns what a small permutation p-value of the measure means, in words."""
        if not self.higher_is_similar:
            return f"{self.alike} than images paired at random: p over permutations with a distance <= the observed one"
        return (
            f"{self.alike} than images paired at random: p over permutations with {self.label or self.name} >= "
            "the observed one"
        )


class _Registry(Mapping):
    """The registered measures by name, iterated in their declared `order`."""

    def __init__(self) -> None:
        self._by_name: dict[str, Measure] = {}

    def add(self, m: Measure) -> None:
        old = self._by_name.get(m.name)
        if old is not None and type(old).__qualname__ != type(m).__qualname__:
            raise VitseeError(
                f"two measures are named '{m.name}': {type(old).__module__}.{type(old).__name__} "
                f"and {type(m).__module__}.{type(m).__name__}: rename one"
            )
        self._by_name[m.name] = m

    def __getitem__(self, name: str) -> Measure:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._by_name, key=lambda n: (self._by_name[n].order, n)))

    def __len__(self) -> int:
        return len(self._by_name)


REGISTRY = _Registry()


def measure(name: str) -> Measure:
    """Returns the registered measure called name; raises naming the known ones."""
    if name not in REGISTRY:
        raise VitseeError(f"unknown measure '{name}': use one of {', '.join(REGISTRY)}")
    return REGISTRY[name]
