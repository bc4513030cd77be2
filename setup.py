"Installs hara_ref from the nbdev configuration in settings.ini (requirements, console scripts, metadata)."
from configparser import ConfigParser
import setuptools

cfg = ConfigParser(delimiters=['='])
cfg.read('settings.ini', encoding='utf-8')
cfg = cfg['DEFAULT']

setuptools.setup(
    name=cfg['lib_name'], version=cfg['version'], description=cfg['description'],
    author=cfg['author'], author_email=cfg['author_email'], license='Apache-2.0',
    url=cfg['git_url'], packages=setuptools.find_packages(include=[cfg['lib_path'], cfg['lib_path'] + '.*']),
    python_requires='>=' + cfg['min_python'], include_package_data=True, zip_safe=False,
    install_requires=cfg.get('requirements', '').split(),
    extras_require={'dev': cfg.get('dev_requirements', '').split(), 'trl': cfg.get('trl_requirements', '').split()},
    long_description=open('README.md', encoding='utf-8').read(), long_description_content_type='text/markdown',
    entry_points={'console_scripts': cfg.get('console_scripts', '').split(),
                  'nbdev': [f'{cfg["lib_path"]}={cfg["lib_path"]}._modidx:d']},
    keywords=cfg['keywords'].split(),
)
