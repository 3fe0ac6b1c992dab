"""`composer-prime wheelhouse --node-has FILE` reads the node's `pip freeze` (utils/wheelhouse.node_has):
every form pip writes (==, a direct reference, a comment, an editable line) gives the package's
canonical name, so what the node has is left out of the wheelhouse whatever the spelling."""

from composer_prime.utils.wheelhouse import node_has

# shaped like `python3 -m pip freeze` in a CUDA image (versions as this workplace's image lists them)
FREEZE = """accelerate==1.15.0
huggingface_hub==1.33.0
numpy==2.5.2
Pillow==11.3.0  # a trailing comment
# a whole-line comment
pytest @ file:///tmp/wheels/pytest-8.4.2-py3-none-any.whl
-e git+https://example.invalid/repo.git@0123abc#egg=local_thing
ruamel.yaml===0.18.6
torch==2.11.0
transformers==5.17.0

"""


def test_every_form_gives_the_canonical_name():
    assert node_has(FREEZE) == {"accelerate", "huggingface-hub", "numpy", "pillow", "pytest", "ruamel-yaml", "torch",
                                "transformers"}
    assert node_has("") == set()
