"""The fields a file of records must hold: the option that names each in a message, and
the check that a file's columns have them (CSV/TSV headers in `kroberta.text.recordfiles`,
Parquet and `datasets` schemas in `kroberta.text.arrowfiles`)."""

from kroberta.errors import InputError

TEXT_FIELD_OPTION = "--text-field"  # names prepare's (and fine-tuning's) text field


def check_columns(path, columns, fields: dict, header: bool = False):
    """InputError for the first of `fields` (field -> the option that names it) not in
    `columns` (`header`: a CSV's first line, which may be a record of a headerless file)."""
    if fields and not columns:  # a CSV without even a header line
        raise InputError(f"{path}: empty (no header line, no records)")
    for field, option in fields.items():
        if field not in columns:
            separator = _other_separator(columns, field) if header else None
            if separator is not None:  # `text;label` read as one column: the wrong delimiter
                raise InputError(
                    f"{path}: no column {field!r}: the header {columns[0]!r} is one column, "
                    f"its fields separated by {separator!r}; a .csv is split at commas and a "
                    ".tsv at tabs: write the file with one of those (and its name's suffix)"
                )
            first_line = "; the first line is read as the header" if header else ""
            raise InputError(
                f"{path}: no column {field!r} (columns: {', '.join(columns)}"
                f"{first_line}); pick one with {option}"
            )


def _other_separator(columns, field: str) -> str | None:
    """The character that splits a one-column header into fields that include `field`
    (`text;label` with `;`), or None."""
    if len(columns) != 1:
        return None
    for separator in (";", "\t", ",", "|", ":"):
        if field in columns[0].split(separator):
            return separator
    return None
