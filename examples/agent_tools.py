"""The bundled agent example's tool (`roctune train --stage grpo --tools examples/agent_tools.py`): the Zentrix
catalogue, an invented shop whose prices no model can know. The model must call `lookup` and answer with the price
it returns. Held-out questions (examples/agent_catalogue_eval.jsonl) ask about items no training question names.

A tool, by TRL's convention: a public function with type hints and a docstring that documents every argument; the
JSON schema the model reads is made from them (transformers' get_json_schema)."""

CATALOGUE = {
    'Glimmerdrake kayak': 393,
    'Vortek easel': 111,
    'Brindleshaw candle': 572,
    'Quillnax desk': 741,
    'Morvane teapot': 76,
    'Tessaly rake': 589,
    'Oxbright lantern': 73,
    'Zumbrel jar': 645,
    'Kestrova compass': 222,
    'Plonquist hammock': 520,
    'Drevanti locket': 708,
    'Sollberry needle': 556,
    'Mirquet violin': 449,
    'Tavrosh mirror': 807,
    'Yelmandy lamp': 333,
    'Corvaxa pillow': 488,
    'Frendle mug': 611,
    'Ishtavo basket': 957,
    'Lunquar quiver': 476,
    'Pemberrow radio': 382,
    'Quorvin oven': 318,
    'Rasmolt saddle': 266,
    'Skelvane wallet': 825,
    'Threnody jacket': 196,
    'Umbrisk ladder': 727,
    'Valquist kettle': 810,
    'Wendrake globe': 261,
    'Xanthor kite': 95,
    'Yorrick bucket': 600,
    'Zelphane vase': 319,
    'Abrelle piano': 549,
    'Bostrim table': 518,
    'Cindral umbrella': 908,
    'Dulvane clock': 363,
    'Esmolt rug': 758,
    'Fariqen bench': 471,
    'Gorvash drum': 306,
    'Helminth ottoman': 635,
    'Ilvaro iron': 86,
    'Jostrel quilt': 132,
    'Karnuva stool': 536,
    'Lessomir fan': 440,
    'Marquez chair': 180,
    'Nolvani pen': 787,
    'Ostrava mat': 362,
    'Prendal sofa': 167,
    'Quimbly blanket': 967,
    'Rostova notebook': 512,
}
_BY_NAME = {name.lower(): name for name in CATALOGUE}


def lookup(item: str) -> str:
    """Look up an item of the Zentrix catalogue and return its price in credits.

    Args:
        item: The item's name, e.g. "Oxhallow bell".
    """
    key = " ".join(item.lower().replace("the ", " ").split())
    if key not in _BY_NAME:
        return f"no item named {item!r} in the catalogue"
    name = _BY_NAME[key]
    return f"{name}: {CATALOGUE[name]} credits"
